"""The log rules' cost on the lines POST /logs brings the leader: the shipped GPU-training
rules (the nine a first start turns on) over a training job's lines (Megatron-LM's, the
repository's fixture, each line of a pod of the job), CPU microseconds a line; with each
rule's keywords tested before its pattern (as the engine does) and, for comparison,
without (every pattern searched in every line).

.venv/bin/python -m bench.log_rules [--lines 100000]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from lens_ebpf.recorder.alerts import logtemplates
from lens_ebpf.recorder.alerts.logrules import Line, LogRules
from lens_ebpf.recorder.store.writer import engine_for, upgrade

FIX = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "training"


def run(rules: LogRules, lines: list[Line]) -> float:
    """CPU microseconds a line, the lines evaluated in POST-sized batches of 1,000."""
    cpu = time.process_time()
    for i in range(0, len(lines), 1000):
        rules.evaluate(lines[i : i + 1000])
    return (time.process_time() - cpu) / len(lines) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.log_rules")
    ap.add_argument("--lines", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        eng = engine_for(f"sqlite:///{tmp}/rules.db")
        upgrade(eng)
        now = datetime.now(UTC)
        with eng.begin() as conn:
            made = logtemplates.seed(conn, now, "", True)
        text = [x for x in (FIX / "megatron-single-node.log").read_text().splitlines() if x]
        lines = [
            Line(
                now,
                text[i % len(text)],
                "ml",
                f"bert-worker-{i % 64}",
                f"u{i % 64}",
                "pytorch",
                f"gpu-{i % 8}",
                "uid-bert",
                "bert",
                "PyTorchJob",
                "local",
            )
            for i in range(args.lines)
        ]
        rules = LogRules(eng, 3600, lambda: now)
        with_keywords = run(rules, lines)
        rules.rules = [dataclasses.replace(r, keywords=()) for r in rules.rules]
        without = run(rules, lines)
        eng.dispose()
    print(
        f"{made} rules, {args.lines:,} Megatron-LM lines (mean "
        f"{sum(len(x.text) for x in lines) / len(lines):.0f} characters): "
        f"{with_keywords:.1f} us of CPU a line with keywords first, {without:.1f} us "
        "searching every pattern"
    )


if __name__ == "__main__":
    main()
