"""The `drive` command line: one table of subcommands, each a frozen dataclass parsed by tyro.

Every command lives in its own module exposing `Config` (a frozen dataclass whose field docstrings are the help
text) and `run(cfg) -> int | None`. Modules are imported only when their command runs, so `drive --help` is fast
and a broken optional dependency cannot take the whole CLI down. `main(argv)` is callable in-process for tests.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

# command words -> (module, one-line help). The module provides `Config` and `run(cfg)`.
COMMANDS: dict[tuple[str, ...], tuple[str, str]] = {
    ("demo",): ("drive.demo", "Main job on the embedded default: shipped expert drives, demos recorded, video saved."),
    ("collect",): ("drive.collect", "Record expert demonstrations in CarRacing (resumable, parallel workers)."),
    ("data", "info"): ("drive.data_info", "Summarise a recorded demonstration dataset."),
    ("expert", "train"): ("drive.expert_train", "Train the PPO expert on privileged state, pick it on unseen tracks."),
    ("eval",): ("drive.evaluate", "Closed-loop evaluation of an expert or trained controller on track seeds."),
    ("train",): ("drive.train", "Train a controller (NSAC or a baseline) on a task or recorded data."),
    ("dagger",): ("drive.dagger", "DAgger round: a trained clone drives, the expert labels, data is aggregated."),
    ("replay",): ("drive.replay", "Render an episode trace to a video with the uncertainty overlay."),
    ("drive",): ("drive.live", "Drive live with the uncertainty overlay (pygame window, video when headless)."),
    ("udacity", "drive"): ("drive.udacity_drive", "Drive the Udacity simulator over socket.io with a controller."),
    ("udacity", "record"): ("drive.udacity_record", "Record the Udacity simulator in its own driving_log.csv format."),
    ("sa", "calibrate"): ("drive.sa_calibrate", "Calibrate inference-time stochastic attention (nu) on a controller."),
    ("bench", "collect"): ("drive.bench.collect", "Benchmark: stock env vs fast renderer vs collect (1, 2 workers)."),
    ("bench", "attention"): ("drive.bench.attention", "Benchmark: NSAC attention vs torch SDPA, time and memory."),
    ("bench", "latency"): ("drive.bench.latency", "Benchmark: per-step controller latency, S samples vs one pass."),
    ("bench", "udacity"): ("drive.bench.udacity", "Benchmark: Udacity telemetry -> steer round trip latency."),
}


def _usage() -> str:
    lines = ["usage: drive COMMAND [OPTIONS]   (drive COMMAND --help for its options)", "", "commands:"]
    available = {words: spec for words, spec in COMMANDS.items() if importlib.util.find_spec(spec[0]) is not None}
    width = max(len(" ".join(w)) for w in available) if available else 10
    for words, (_, help_) in available.items():
        lines.append(f"  {' '.join(words):<{width}}  {help_}")
    return "\n".join(lines)


def _find_command(argv: list[str]) -> tuple[tuple[str, ...], list[str]] | None:
    # Longest match first, so `drive udacity drive` wins over `drive drive`-style prefixes.
    for words in sorted(COMMANDS, key=len, reverse=True):
        if tuple(argv[: len(words)]) == words:
            return words, argv[len(words) :]
    return None


def main(argv: list[str] | None = None) -> int:
    import tyro

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from drive import __version__

        print(__version__)
        return 0
    found = _find_command(argv)
    if found is None:
        print(f"drive: unknown command {' '.join(argv[:2])!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    words, rest = found
    module_name, help_ = COMMANDS[words]
    module = importlib.import_module(module_name)
    cfg = tyro.cli(module.Config, args=rest, prog=f"drive {' '.join(words)}", description=help_)
    code = module.run(cfg)
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
