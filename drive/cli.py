"""The `drive` command line: one table of command words, each a module of drive/commands with `Config` (a frozen
dataclass whose field docstrings are the help text) and `run(cfg) -> int`, parsed by tyro.

Modules are imported only when their command runs, so `drive --help` is fast and a broken optional dependency
cannot take the whole CLI down. A command module keeps its `Config` on light imports and imports its engine (torch,
gymnasium, matplotlib, Ray, the controllers) at the top of `run`, so `drive COMMAND --help` loads none of them either
(tests/drive/commands/test_help.py). An optional `epilog()` is printed after the options by `--help`. `main(argv)` is
callable in-process for tests.

A command module that sets `RESUMES = True` continues its work when its command is rerun; Ctrl-C there says so.

Errors: anything foreseeable (`drive.errors.USER_ERRORS`: bad option values, missing or wrong files, a port that
cannot be bound) and every option the parser rejects end in one line, `drive COMMAND: error: ...`, exit code 2;
`--debug` anywhere on the line (or DRIVE_DEBUG=1) shows the traceback instead. Ctrl-C prints one line, exit 130.
Anything else is a defect and keeps its traceback.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import logging
import os
import re
import sys
from typing import Any

from drive.errors import USER_ERRORS, one_line

# command words -> one-line help; the module is drive.commands.<words joined by dots>
COMMANDS: dict[tuple[str, ...], str] = {
    ("demo",): "Main job on the embedded default: shipped expert drives, demos recorded, shipped NSAC drives.",
    ("collect",): "Record expert demonstrations in CarRacing (resumable, parallel workers).",
    ("data", "info"): "Summarise a recorded demonstration dataset.",
    ("expert", "train"): "Train the PPO expert on privileged state, pick it on unseen tracks.",
    ("eval",): "Closed-loop evaluation of an expert or trained controller on track seeds.",
    ("train",): "Train a controller (NSAC or a baseline) on a task or recorded data.",
    ("dagger",): "DAgger round: a trained clone drives, the expert labels, data is aggregated.",
    ("export",): "Export a controller (ONNX, TorchScript; checked against PyTorch) or demonstrations (Minari).",
    ("results",): "Table of controllers trained and driven alike (closed loop beside offline metrics).",
    ("ood",): "Offline OOD detection: each controller's uncertainty on test frames vs perturbed camera frames.",
    ("replay",): "Render an episode trace to a video with the uncertainty overlay.",
    ("drive",): "Drive live with the uncertainty overlay (pygame window, video when headless).",
    ("calibrate",): "Fit a controller's aleatoric temperature on nominal laps (shadow-expert coverage), store it.",
    ("fallback", "calibrate"): "Calibrate a controller's fallback threshold on nominal laps, store it in the file.",
    ("udacity", "drive"): "Drive the Udacity simulator over socket.io with a controller.",
    ("udacity", "record"): "Record the Udacity simulator in its own driving_log.csv format.",
    ("udacity", "standin"): "The Udacity simulator's client, stand-in: a recording or CarRacing over the protocol.",
    ("sa", "calibrate"): "Calibrate inference-time stochastic attention (nu) on a controller.",
    ("density", "fit"): "Fit a feature density (DDU-style) on a controller's encoder; its score as the signal.",
    ("monitor", "train"): "Train SelfOracle (a VAE, the field's black-box misbehaviour monitor) on demo frames.",
    ("bearings", "features"): "Raw bearing vibration folder (PRONOSTIA / XJTU-SY) -> its window-feature CSV.",
    ("bench", "collect"): "Benchmark: stock env vs fast renderer vs collect (1, 2 workers).",
    ("bench", "attention"): "Benchmark: NSAC attention vs torch SDPA, time and memory.",
    ("bench", "latency"): "Benchmark: per-step controller latency, S samples vs one pass.",
    ("bench", "udacity"): "Benchmark: Udacity telemetry -> steer round trip latency.",
    ("bench", "robustness"): "Benchmark: closed-loop return, coverage, epistemic variance against camera perturbation.",
    ("bench", "dagger"): "Benchmark: uncertainty-gated vs plain DAgger, closed-loop return against expert labels.",
    ("bench", "render"): "Benchmark: the fast CarRacing renderer against the stock one, per frame.",
    ("bench", "closedloop"): "Benchmark: steps per CPU-second from the bare env (stock, ours, EnvPool) to collect and "
    "eval (K cars, 1-2 workers), with ratios.",
    ("bench", "misbehaviour"): "Benchmark: misbehaviour prediction (TTM windows scored alike, F3) and prevention.",
    ("bench", "generalisation"): "Benchmark: CarRacingExtension's variants (Color, Color3, Bar, Blob, Noise) beside "
    "the published agents, ungated and gated.",
    ("bench", "scale"): "Benchmark: collection on 1, 2 Ray workers and training on 1, 2 DDP ranks, with ratios.",
    ("bench", "controllers"): "Benchmark: six controllers at one budget over seeds, offline, closed loop and OOD, with "
    "95 % intervals.",
    ("bench", "offline"): "Benchmark tables of the offline tasks (uci, forecast, spiral): every controller, seed.",
}


def module_name(words: tuple[str, ...]) -> str:
    return "drive.commands." + ".".join(words)


def _usage(group: str = "") -> str:
    """The command table (`group`: only the commands under that first word, e.g. `drive bench --help`)."""
    shown = {w: h for w, h in COMMANDS.items() if not group or (len(w) > 1 and w[0] == group)}
    lines = [
        f"usage: drive {group + ' ' if group else ''}COMMAND [OPTIONS]   (drive COMMAND --help for its options; "
        "--debug shows tracebacks)",
        "",
        "commands:",
    ]
    width = max(len(" ".join(w)) for w in shown)
    for words, help_ in shown.items():
        lines.append(f"  {' '.join(words):<{width}}  {help_}")
    return "\n".join(lines)


def _find_command(argv: list[str]) -> tuple[tuple[str, ...], list[str]] | None:
    for words in sorted(COMMANDS, key=len, reverse=True):  # longest first: `udacity drive` before `drive`
        if tuple(argv[: len(words)]) == words:
            return words, argv[len(words) :]
    return None


def _unknown_command(argv: list[str]) -> str:
    """What `drive trian` is told: the words typed and the closest command, if one is close (`train`; `bench scael`
    -> `bench scale`, `bnech scale` too; `bnech` -> `bench`, which lists its commands)."""
    groups = sorted({w[0] for w in COMMANDS if len(w) > 1})
    two = len(argv) > 1 and not argv[1].startswith("-")
    if argv[0] in groups:  # the group is right: only its second word can be wrong
        typed = " ".join(argv[:2])
        seconds = [w[1] for w in COMMANDS if w[0] == argv[0]]
        guesses = [f"{argv[0]} {g}" for g in difflib.get_close_matches(argv[1], seconds, n=1)] if two else []
    else:
        pairs = [" ".join(w) for w in COMMANDS if len(w) > 1]
        guesses = difflib.get_close_matches(" ".join(argv[:2]), pairs, n=1) if two else []
        typed = " ".join(argv[:2]) if guesses else argv[0]
        guesses = guesses or difflib.get_close_matches(argv[0], [" ".join(w) for w in COMMANDS] + groups, n=1)
    hint = f"did you mean {guesses[0]!r}? " if guesses else ""
    return f"unknown command {typed!r} ({hint}drive --help lists them)"


class _ParseError(Exception):
    """tyro rejected the command line; the message is one line."""


def _parse_error_message(event: Any) -> str:
    """One line for any tyro parse-failure event (tyro._errors; unknown kinds fall back to their class name)."""
    from tyro import _errors as te

    def flag(arg: Any) -> str:
        lowered = arg.lowered
        return str(lowered.metavar) if arg.is_positional() else "/".join(lowered.name_or_flags)

    if isinstance(event, te.UnrecognizedArgs):
        return f"unrecognized option(s): {' '.join(event.tokens)}"
    if isinstance(event, te.MissingArgs):
        return "missing required option(s): " + ", ".join(flag(a.arg) for a in event.missing_arguments)
    if isinstance(event, te.InvalidChoice):
        return f"{flag(event.argument)}: invalid choice {event.value!r} (choose from {', '.join(event.choices)})"
    if isinstance(event, te.BadValue):
        value = f" {event.offending_value!r}" if event.offending_value is not None else ""
        return f"{flag(event.argument)}: invalid value{value} ({one_line(Exception(event.reason))})"
    if isinstance(event, te.InstantiationFailure):
        if event.argument is None:
            return one_line(Exception(event.message))
        expected = str(event.argument.lowered.metavar or "").replace("{None}|", "")
        reasons = [
            line.rsplit("]: ", 1)[-1]
            for line in event.message.splitlines()
            if line.startswith("- ") and "NoneType" not in line and "]: " in line
        ]
        message = one_line(Exception(event.message))
        found = re.search(r"from \[(.*?)\]", message)
        got = found.group(1).replace("'", "") if found else ""
        if reasons and "invalid literal" not in reasons[-1]:
            message = reasons[-1]
        elif "could be instantiated" in message or "invalid literal" in message or not message:
            message = f"invalid value{f' {got!r}' if got else ''} (expected {expected})"
        return f"{flag(event.argument)}: {message}"
    return f"invalid command line ({type(event).__name__})"


def _help_registry() -> Any:
    """tyro as it is, but for how `--help` shows an option's default (tyro appends "(default: VALUE)" to every one):
    - a field docstring that says "default" states the option's default in the user's words ("default: print only"),
      so tyro's own, often "(default: None)", is left off: one default per option;
    - a default naming a path inside the checkout (the shipped checkpoints) is shown relative to it, not as this
      machine's absolute path; the value itself stays absolute, so it is found from any working directory.
    A field's own `tyro.conf.arg(help_behavior_hint=...)` still wins."""
    import dataclasses
    from typing import Annotated, get_args, get_origin

    import tyro
    from tyro.constructors import ConstructorRegistry, StructConstructorSpec, StructTypeInfo

    from datasets.root import REPO

    registry = ConstructorRegistry()
    delegating: list[bool] = []  # set while tyro's own dataclass rule runs: this rule then steps aside

    def hint(field: Any) -> Any:
        helptext = field.helptext() if callable(field.helptext) else field.helptext
        if re.search(r"\bdefault", helptext or "", re.IGNORECASE):
            return tyro.conf.arg(help_behavior_hint="")
        if str(REPO) in str(field.default):
            inside = str(REPO) + os.sep
            return tyro.conf.arg(help_behavior_hint=lambda label: f"(default: {label.replace(inside, '')})")
        return None

    @registry.struct_rule
    def own_defaults(info: StructTypeInfo) -> StructConstructorSpec | None:
        if delegating or not dataclasses.is_dataclass(info.type):
            return None
        delegating.append(True)
        try:
            spec = ConstructorRegistry.get_struct_spec(info)
        finally:
            delegating.pop()
        if not isinstance(spec, StructConstructorSpec):
            return None
        fields = []
        for field in spec.fields:
            conf = hint(field)
            if conf is not None:  # placed before the field's own annotations, which tyro applies after it
                kind, *extras = get_args(field.type) if get_origin(field.type) is Annotated else (field.type,)
                annotated: Any = Annotated[(kind, conf, *extras)]
                field = dataclasses.replace(field, type=annotated)
            fields.append(field)
        return dataclasses.replace(spec, fields=tuple(fields))

    return registry


def _parse(module: Any, rest: list[str], prog: str, help_: str) -> Any:
    import tyro
    from tyro import _errors as te

    def hook(event: Any) -> None:
        raise _ParseError(_parse_error_message(event))

    try:
        with te.on_parse_error(hook):
            return tyro.cli(module.Config, args=rest, prog=prog, description=help_, registry=_help_registry())
    except SystemExit as exc:  # --help: the command's options first, then what its epilog() adds (train: --set keys)
        if exc.code in (0, None) and hasattr(module, "epilog") and any(a in ("-h", "--help") for a in rest):
            print("\n" + module.epilog())
        raise


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `drive data info --json | head`: the reader has what it wanted; nothing is wrong
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        return 0


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("DRIVE_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from drive import __version__

        print(__version__)
        return 0
    found = _find_command(argv)
    groups = {w[0] for w in COMMANDS if len(w) > 1}
    if found is None and argv[0] in groups and (len(argv) == 1 or argv[1] in ("-h", "--help")):
        print(_usage(argv[0]))  # `drive bench`, `drive udacity --help`: that group's commands
        return 0
    if found is None:
        print(f"drive: error: {_unknown_command(argv)}", file=sys.stderr)
        return 2
    words, rest = found
    prog = f"drive {' '.join(words)}"
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    module = None
    try:
        module = importlib.import_module(module_name(words))
        cfg = _parse(module, rest, prog, COMMANDS[words])
        return int(module.run(cfg) or 0)
    except _ParseError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise  # an OSError, but not the user's: main() ends quietly
    except USER_ERRORS as exc:
        if debug:
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        again = "; rerun the same command to continue (what finished is kept)" if getattr(module, "RESUMES", 0) else ""
        print(f"{prog}: interrupted{again}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
