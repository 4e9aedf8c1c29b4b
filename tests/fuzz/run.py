"""Run the fuzz suite outside pytest: a long campaign, or one case from its seed.

    python -m tests.fuzz.run --seconds 3600            # an hour of new seeds, 2 zygotes
    python -m tests.fuzz.run --cases 160               # the CI corpus
    python -m tests.fuzz.run --seed 17                 # one case, in a forked child
    python -m tests.fuzz.run --seed 17 --inline        # ... in this process, for a debugger

Every verdict goes to --report (JSON lines); failures are printed as they happen and
summed up at the end. The exit status is 1 if any case failed."""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time

from .cases import ci_cases
from .child import cap_memory, child_environment, run_case
from .harness import Zygote, describe, passed


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, help="run new seeds for this long")
    parser.add_argument("--cases", type=int, help="run this many seeds")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seed", type=int, action="append", help="run this seed (repeatable)")
    parser.add_argument("--inline", action="store_true", help="run --seed in this process")
    parser.add_argument("--jobs", type=int, default=2, help="zygotes in parallel (default 2)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--report", default="fuzz-report.jsonl", help="verdicts, one per line")
    return parser.parse_args(argv)


def campaign(seeds, jobs: int, timeout: float, deadline: float | None, report: str) -> list[dict]:
    """Run ``seeds`` (an iterator) on ``jobs`` zygotes until exhausted or ``deadline``."""
    lock = threading.Lock()
    verdicts: list[dict] = []
    seeds = iter(seeds)

    def worker():
        zygote = Zygote(timeout)
        try:
            while deadline is None or time.monotonic() < deadline:
                with lock:
                    seed = next(seeds, None)
                if seed is None:
                    return
                verdict = zygote.run(seed)
                with lock:
                    verdicts.append(verdict)
                    with open(report, "a") as f:
                        f.write(json.dumps(verdict, default=str) + "\n")
                    if not passed(verdict):
                        print(describe(verdict), flush=True)
        finally:
            zygote.close()

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return verdicts


def summary(verdicts: list[dict], seconds: float) -> str:
    outcomes = collections.Counter(v["outcome"] for v in verdicts)
    failed = [v for v in verdicts if not passed(v)]
    by_family = collections.Counter((v.get("family"), v["outcome"]) for v in failed)
    lines = [
        f"{len(verdicts)} cases in {seconds:.0f} s: "
        + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())),
        f"{len(failed)} failed",
    ]
    lines += [f"  {fam}: {n} {out}" for (fam, out), n in sorted(by_family.items())]
    for v in sorted(failed, key=lambda v: v["seed"]):
        lines.append(
            f"  seed {v['seed']} {v.get('family')}/{v.get('template')} {v['outcome']}: "
            f"{str(v.get('detail', ''))[:160]}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.seed and args.inline:
        child_environment()
        cap_memory()
        verdicts = [run_case(s) for s in args.seed]
        for v in verdicts:
            print(json.dumps(v, indent=1, default=str))
        return 0 if all(map(passed, verdicts)) else 1
    start = time.monotonic()
    deadline = None
    if args.seed:
        seeds = iter(args.seed)
    elif args.seconds:
        deadline = start + args.seconds
        seeds = iter(range(args.start, sys.maxsize))
    else:
        seeds = iter(range(args.start, args.start + (args.cases or ci_cases())))
    verdicts = campaign(seeds, args.jobs, args.timeout, deadline, args.report)
    if args.seed:
        for v in verdicts:
            print(json.dumps(v, indent=1, default=str))
    print(summary(verdicts, time.monotonic() - start))
    return 0 if all(map(passed, verdicts)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
