"""Run the benchmarks: ``python benchmarks/run.py [--smoke] [--family NAME] [--rounds K]
[--json FILE] [--offset BYTES] [--interleave]``.

--smoke runs every benchmark once on tiny shapes (CI does this to keep them working).
--rounds K runs the whole selection K times over and reports medians with each ratio's
range (a shared VM drifts by 30% within minutes; rounds spread that over every row).
--offset B starts every input array B bytes past a 64-byte line (default 0: on a line,
as TF's own tensors are; see harness.place).
--interleave takes tfgrad's, TF's and PyTorch's timing samples in turn instead of one
implementation after another (harness.time_interleaved): on a VM whose memory speed drifts
it keeps a slow spell from landing on one implementation only.
"""

from __future__ import annotations

import argparse
import sys

from tfgrad.testing import FAMILIES, harness, load


def benches(families: list[str]) -> list[harness.Bench]:
    """Every benchmark of these families (their BENCHES, tfgrad.testing.cases.<family>)."""
    modules, problems = load(families)
    if problems:
        raise SystemExit("\n".join(problems))
    return [b for m in modules.values() for b in m.BENCHES]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, one quick run each")
    p.add_argument("--family", action="append", choices=FAMILIES)
    p.add_argument("--op", help="only benchmarks of this op")
    p.add_argument("--rounds", type=int, default=1, help="run everything K times; medians")
    p.add_argument("--json", help="also write the results as JSON")
    p.add_argument("--offset", type=int, default=0,
                   help="bytes past a 64-byte line where each input array starts (0: on a "
                        "line, as TF's own tensors; 16: where NumPy puts large arrays)")
    p.add_argument("--interleave", action="store_true",
                   help="take the implementations' timing samples in turn, not one after another")
    args = p.parse_args(argv)
    selected = benches(args.family or list(FAMILIES))
    if args.op:
        selected = [b for b in selected if b.name == args.op]
    rounds = []
    for k in range(max(1, args.rounds)):
        rows = []
        for b in selected:
            rows.append(harness.run_bench(b, smoke=args.smoke, offset=args.offset,
                                          interleave=args.interleave))
            print(f"  [{k + 1}] {b.name} {b.shape}: {rows[-1]['tfgrad_ms']:.3f} ms",
                  file=sys.stderr)
        rounds.append(rows)
    rows = rounds[0] if len(rounds) == 1 else harness.merge_rounds(rounds)
    env = dict(harness.environment(), input_offset=args.offset, interleave=args.interleave)
    print(harness.report(rows, env, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
