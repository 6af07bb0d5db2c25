"""The command line: arguments checked, every job composed and validated once, then run.

``precheck`` refuses unknown keys and presets (``pdbench.config.overrides``), composes every
job of the command line (each of a ``-m`` sweep) with Hydra's compose API
(``pdbench.config.compose``), types it and runs ``pdbench.validate.rules`` on it. Whatever is
wrong comes back as one ``UsageError`` that ``__main__`` prints alone and exits 2 with; a
typo never gets as far as a launch. The typed jobs it returns are the ones that run:
``dispatch`` runs one job's ``command``; the SLURM runs of a sweep are all submitted before
any is followed. Hydra's own options that print (``--cfg``, ``--info``, ``--hydra-help``,
shell completion) go to Hydra as they are.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf.errors import OmegaConfBaseException

from pdbench.config.compose import Composer, compose_job
from pdbench.config.hydra_private import args_parser
from pdbench.config.overrides import (
    OverrideError,
    as_lists,
    check_overrides,
    closest,
    combinations,
    schema,
)
from pdbench.config.schema import Command, ExecutorKind, RunConfig, register_configs
from pdbench.config.unread import unread_settings
from pdbench.driver.launch import Ended, Launched, finish_sweep, launch
from pdbench.driver.preflight import run_preflight_alone
from pdbench.driver.progress import DEBUG_ENV
from pdbench.driver.report_table import print_run_table
from pdbench.driver.run_dir import RunDir
from pdbench.driver.serve import serve, serve_problem
from pdbench.driver.slurm_partitions import partition_problem
from pdbench.driver.status import print_status, stop_leftovers
from pdbench.driver.transfer_bench import run_transfer_bench
from pdbench.plan.deployments import make_plan
from pdbench.plan.sweep import Composition, Launch, fold, launch_line, plan_sweep, table
from pdbench.results.disk import write_problem
from pdbench.results.manifest import LaunchOrigin
from pdbench.validate.rules import ConfigError, validate, warnings

__all__ = ["compose_job", "main", "parse_argv", "precheck"]  # compose_job: one job, typed

RUN_ALIASES = ("run.dir=", "run.name=")  # older spellings of dir= and name=
CHECK_VERB = "check"  # validate the command line's jobs, start nothing
# Hydra options that print something instead of running a job (no validation needed).
SHOW_ONLY = ("hydra_help", "shell_completion", "info")


class UsageError(Exception):
    """A command line or config that must not start anything: printed alone, exit 2."""


@dataclass
class Invocation:
    """One command line, split as Hydra reads it."""

    overrides: list[str]  # key=value words (verbs already turned into command=VERB)
    flags: list[str]  # Hydra's own options, passed on untouched
    multirun: bool = False
    check_only: bool = False  # the verb check: compose and validate, run nothing
    shows_config: bool = False  # --cfg/--resolve: print the config, run nothing
    show_only: bool = False  # --hydra-help, --info, --shell-completion
    errors: list[str] = field(default_factory=list)

    @property
    def argv(self) -> list[str]:
        return [*self.flags, *self.overrides]


def _verb_or_error(word: str, errors: list[str]) -> str | None:
    verbs = [c.value for c in Command] + [CHECK_VERB]
    if word in verbs:
        return f"command={word}" if word != CHECK_VERB else None
    near = difflib.get_close_matches(word, verbs, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    if word.startswith(("analy", "report")):
        hint = "results are analysed by python -m analysis RUN_DIR. "
    elif (Path(word).expanduser() / "manifest.json").is_file():
        hint = f"did you mean dir={word}? "
    errors.append(
        f"{word}: not a command and not key=value; {hint}Commands: {', '.join(verbs)} "
        "(python -m pdbench --help)"
    )
    return None


def _flag_error(flag: str) -> str:
    """An option Hydra does not know, with the setting it most likely meant."""
    key = flag.lstrip("-").split("=", 1)[0].replace("-", "_")
    fields = list(schema().fields)
    near = [f for f in fields if f.rsplit(".", 1)[-1] == key] or difflib.get_close_matches(
        key, fields, n=1
    )
    hint = f"; did you mean {near[0]}=...?" if near else ""
    return f"{flag}: not an option{hint} (settings are key=value; python -m pdbench --help)"


def parse_argv(argv: list[str]) -> Invocation:
    """Hydra's options apart from overrides; verbs (``status``) become ``command=``."""
    args, unknown = args_parser().parse_known_intermixed_args(argv)  # hydra.main's own
    inv = Invocation(overrides=[], flags=[])
    flag_words = [w for w in unknown if w.startswith("-")]
    inv.errors += [_flag_error(word) for word in flag_words]
    for word in [*args.overrides, *(w for w in unknown if not w.startswith("-"))]:
        if word.startswith(RUN_ALIASES):
            inv.overrides.append(word[len("run.") :])
        elif word == CHECK_VERB:
            inv.check_only = True
        elif "=" not in word and not word.startswith("~"):
            verb = _verb_or_error(word, inv.errors)
            if verb:
                inv.overrides.append(verb)
        else:
            inv.overrides.append(word)
    verbs = [o for o in inv.overrides if o.startswith("command=")]
    if len(verbs) > 1:
        inv.errors.append(f"{' '.join(verbs)}: one command at a time")
    inv.overrides = as_lists(inv.overrides)  # an axis given one value is a list of one
    inv.flags = [w for w in argv if w not in args.overrides and w not in unknown]
    inv.multirun = bool(args.multirun)
    inv.shows_config = bool(args.cfg or args.resolve)
    inv.show_only = any(getattr(args, name, None) for name in SHOW_ONLY)
    if inv.multirun and (args.cfg or inv.show_only):
        inv.errors.append(
            "-m with --cfg/--info: Hydra prints one job's config; drop -m, or validate every "
            "job of the sweep with: python -m pdbench check -m ..."
        )
    return inv


DETAIL_MARKS = ("full_key:", "reference_type=", "object_type=", "$VALUE")
# OmegaConf's words for a mistake, and the fix pdbench adds to them.
FIXES = {
    "is not a ListConfig": "Fix: a list is written in brackets and quoted for the shell: "
    "'transport.backends=[UCX]'",
    "could not be converted to": "Fix: a value of the setting's type (--cfg job shows each)",
}


_INVALID_CHOICE = re.compile(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]")
_FULL_KEY = re.compile(r"full_key: (\S+)")


def choice_fix(err: BaseException) -> list[str]:
    """For a value outside a closed set (an Enum field), the setting and the closest choice."""
    text = "\n".join(str(e) for e in (err, err.__cause__, err.__context__) if e is not None)
    invalid, key = _INVALID_CHOICE.search(text), _FULL_KEY.search(text)
    if invalid is None:
        return []
    value, choices = invalid.group(1), [c.strip() for c in invalid.group(2).split(",")]
    near = closest(value, choices, n=1)
    setting = f"{key.group(1)}=" if key else ""
    return [f"Fix: {setting}{near[0] if near else choices[0]} (one of {', '.join(choices)})"]


def error_text(err: BaseException, depth: int = 2) -> str:
    """An exception and its first cause, without a traceback or OmegaConf's detail lines."""
    lines: list[str] = []
    current: BaseException | None = err
    while current is not None and depth > 0:
        for line in str(current).strip().splitlines():
            if line.strip() and line not in lines and not any(m in line for m in DETAIL_MARKS):
                lines.append(line)
        current, depth = current.__cause__ or current.__context__, depth - 1
    return "\n".join(lines)


def _recent_runs(root: Path = Path("results"), n: int = 3) -> list[str]:
    runs = sorted(root.glob("*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [str(p.parent) for p in runs[:n]]


def _status_problems(job: list[str], cfg: RunConfig) -> list[str]:
    """``status`` and ``stop`` read a run directory: it must be named, and be one."""
    runs = _recent_runs()
    recent = f" Recent runs: {', '.join(runs)}" if runs else ""
    verb = cfg.command.value
    if not any(o.startswith("dir=") for o in job):
        return [f"{verb} needs the run directory: {verb} dir=RESULTS_DIR.{recent}"]
    if not (Path(cfg.dir).expanduser() / "manifest.json").is_file():
        return [
            f"dir={cfg.dir}: no manifest.json there: not a pdbench run directory. "
            f"Fix: the run directory python -m pdbench printed.{recent}"
        ]
    return []


@dataclass
class Job:
    """One job of a command line: its overrides (one value per key) and its typed config."""

    overrides: list[str]
    cfg: RunConfig
    # what will likely weaken the answer without making it impossible (rules.warnings):
    # said before the job runs or is checked, never refused
    warnings: list[str] = field(default_factory=list)


class Jobs(list[Job]):
    """Every job of a command line, typed and validated, in order; ``composer`` composed
    them and holds what Hydra sets up for jobs that run (their logging); ``compositions``:
    the jobs with those differing only in sweep-axis values folded into one
    (``pdbench.plan.sweep.fold``), validated too."""

    def __init__(self) -> None:
        super().__init__()
        self.composer = Composer()
        self.compositions: list[Composition] = []


def precheck(inv: Invocation) -> Jobs:
    """Every job of the command line, typed and validated; ``UsageError`` otherwise."""
    from hydra.errors import HydraException  # lazy: hydra, not for --help

    errors = list(inv.errors)
    try:
        parsed = check_overrides(inv.overrides)
    except OverrideError as err:
        errors += err.problems
        parsed = []
    if errors:
        raise UsageError(f"{len(errors)} problem(s) on the command line:\n" + "\n".join(errors))
    jobs = combinations(parsed)
    if len(jobs) > 1 and not inv.multirun:
        raise UsageError(
            "a value list (a,b) sweeps: add -m to run one job per value (Hydra multirun)"
        )
    typed, problems = Jobs(), []
    for job in jobs:
        label = f"[{' '.join(job)}] " if len(jobs) > 1 else ""
        try:
            cfg = typed.composer(job)
        except (HydraException, OmegaConfBaseException) as err:
            text = error_text(err)
            fixes = choice_fix(err) + [fix for words, fix in FIXES.items() if words in text]
            problems.append(label + "\n".join([text, *fixes[:1]]))
            continue
        typed.append(Job(job, cfg))
        if cfg.command in (Command.status, Command.stop):
            problems += _status_problems(job, cfg)
            continue
        found = unread_settings(job, cfg) + validate(cfg)
        problems += [label + str(p) for p in found]
        if not found:
            typed[-1].warnings = [label + str(w) for w in warnings(cfg)]
    if not problems:
        typed.compositions = fold([job.cfg for job in typed])
        problems += folded_problems(typed)
    if problems:
        raise UsageError(f"{len(problems)} problem(s) in the config:\n" + "\n".join(problems))
    return typed


def folded_problems(jobs: Jobs) -> list[str]:
    """What validation finds in the compositions a sweep folded (several values of one axis
    together: a working-set sweep's premises, a search over loads...) that no single job had."""
    out = []
    for comp in jobs.compositions:
        if len(comp.members) > 1:
            label = f"[{' + '.join(' '.join(jobs[i].overrides) for i in comp.members)}] "
            out += [label + str(p) for p in validate(comp.cfg)]
    return out


def launch_refusals(jobs: list[Job], origin: LaunchOrigin) -> list[str]:
    """What the launch of each job refuses beyond ``precheck`` (so that ``check`` says what
    the launch and its dry run would): a run or serve into a dir holding another experiment
    (``RunDir.open``, as the dry run calls it), a serve of a config planning several
    deployments. Nothing is written, nothing claimed."""
    problems: list[str] = []
    for job in jobs:
        cfg = job.cfg
        label = f"[{' '.join(job.overrides)}] " if len(jobs) > 1 else ""
        partition = partition_problem(cfg)
        if partition is not None:
            problems.append(label + str(partition))
            continue
        if cfg.command not in (Command.run, Command.serve):
            continue
        plan = make_plan(cfg)
        found = serve_problem(plan) if cfg.command is Command.serve else None
        if found is not None:
            problems.append(label + str(found))
            continue
        try:
            RunDir.open(cfg, plan, origin, claim=False)
        except ConfigError as err:
            problems += [label + str(p) for p in err.problems]
    return problems


def print_warnings(jobs: list[Job]) -> None:
    """Each job's warnings on stderr, one line each, before anything runs."""
    for job in jobs:
        for line in job.warnings:
            print(f"pdbench: warning: {line}", file=sys.stderr, flush=True)


def print_checked(jobs: list[Job]) -> None:
    """What the verb ``check`` prints once every job has passed ``precheck``."""
    for job in jobs:
        label = f"[{' '.join(job.overrides)}] " if len(jobs) > 1 else ""
        print(
            f"{label}ok: {job.cfg.name} ({job.cfg.command.value}) composes and validates; "
            "launch.dry_run=true prints what would run"
        )


def _run(
    cfg: RunConfig,
    origin: LaunchOrigin,
    sweep: list[Launched] | None = None,
    planned: Launch | None = None,
) -> None:
    """A run: launched, followed, its table printed. In a sweep (``sweep`` collects them)
    a SLURM run is only submitted (``finish_sweep`` follows them together); ``planned``:
    the sweep's launch (its plan, its compositions)."""
    submit_only = sweep is not None and submits_now(cfg)
    plan = planned.plan if planned is not None else None
    also = [c.cfg for c in planned.compositions[1:]] if planned is not None else []
    launched = launch(cfg, origin, follow_jobs=not submit_only, plan=plan, also=also)
    if sweep is not None and submit_only:
        sweep.append(launched)
        return
    if launched.ended is Ended.submitted:  # launch.detach=true: submitted, not followed
        print(
            f"[pdbench] {len(launched.jobs)} job(s) submitted; follow them with: "
            f"python -m pdbench status dir={cfg.dir}"
        )
    if launched.ended is not Ended.followed:
        return
    print_run_table(launched.run_dir.store.iter_points(), cfg.dir)
    if not launched.ok:
        raise SystemExit(1)


def _status(cfg: RunConfig, origin: LaunchOrigin) -> None:
    print_status(cfg.dir)


def _stop(cfg: RunConfig, origin: LaunchOrigin) -> None:
    stop_leftovers(cfg.dir)


def _transfer_bench(cfg: RunConfig, origin: LaunchOrigin) -> None:
    run_transfer_bench(cfg)


def _preflight(cfg: RunConfig, origin: LaunchOrigin) -> None:
    if run_preflight_alone(cfg):
        raise SystemExit(1)


def _serve(cfg: RunConfig, origin: LaunchOrigin) -> None:
    serve(cfg, origin)


COMMANDS: dict[Command, Callable[[RunConfig, LaunchOrigin], None]] = {
    Command.run: _run,
    Command.status: _status,
    Command.transfer_bench: _transfer_bench,
    Command.preflight: _preflight,
    Command.serve: _serve,
    Command.stop: _stop,
}


def submits_now(cfg: RunConfig) -> bool:
    """In a ``-m`` sweep, a run submitted at once and followed at the sweep's end with the
    others (SLURM runs them side by side); local runs go one after another."""
    return (
        cfg.command is Command.run
        and cfg.cluster.executor is ExecutorKind.slurm
        and not cfg.launch.dry_run
    )


def dispatch(
    cfg: RunConfig,
    origin: LaunchOrigin,
    sweep: list[Launched] | None = None,
    planned: Launch | None = None,
) -> None:
    """Run ``cfg.command``; ``origin``: the command line (every job of a sweep shares it);
    ``sweep`` and ``planned``: a run's, see ``_run``."""
    if cfg.command is Command.run:
        _run(cfg, origin, sweep, planned)
        return
    COMMANDS[cfg.command](cfg, origin)


DEBUG_FLAG = "--debug"
USAGE_EXIT = 2


def _debug(argv: list[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _fail(err: BaseException, debug: bool) -> None:
    if debug:
        raise err
    print(f"pdbench: {err}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


def _hydra_prints(argv: list[str], debug: bool) -> None:
    """Hand Hydra's own printing options (``--cfg``, ``--info``, ``--hydra-help``, shell
    completion) to Hydra, as ``@hydra.main`` reads them: it prints and runs no job."""
    import hydra  # lazy: hydra (~0.4 s) only here, not for --help
    from omegaconf import DictConfig  # lazy: with hydra

    register_configs()

    @hydra.main(config_path="../conf", config_name="config", version_base="1.3")
    def entry(dcfg: DictConfig) -> None:
        raise AssertionError("Hydra runs no job when it only prints")  # pragma: no cover

    if debug:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    sys.argv = [sys.argv[0], *argv]
    entry()


def file_sha256(path: str) -> str:
    """The file's sha256 ("" when it cannot be read: validation says why)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return ""


def run_jobs(jobs: Jobs, origin: LaunchOrigin, multirun: bool, debug: bool) -> None:
    """Run every job, in order; a sweep's SLURM runs are submitted as they come and
    followed together at its end."""
    jobs.composer.configure_logging()  # as Hydra does for a job
    sweep: list[Launched] | None = [] if multirun else None
    compositions = jobs.compositions or [Composition(job.cfg, [i]) for i, job in enumerate(jobs)]
    for comp in compositions:  # once, here: jobs may start elsewhere
        comp.cfg.dir = str(Path(comp.cfg.dir).expanduser().resolve())
        trace = comp.cfg.workload.trace
        if trace.path:  # the jobs read it wherever they run; its content is its identity
            trace.path = str(Path(trace.path).expanduser().resolve())
            trace.sha256 = file_sha256(trace.path)
    launches = plan_sweep(compositions)
    overrides = [job.overrides for job in jobs]
    if multirun and any(c.cfg.launch.dry_run for c in compositions):
        print(table(launches, overrides), flush=True)
    try:
        for number, planned in enumerate(launches, 1):
            if multirun and not planned.cfg.launch.dry_run and len(planned.members) > 1:
                print(f"[pdbench] sweep: {launch_line(number, planned, overrides)}", flush=True)
            try:
                dispatch(planned.cfg, origin, sweep, planned)
            except ConfigError as err:
                _fail(err, debug)
            except OSError as err:  # the run dir refused a write before the jobs started
                line = write_problem(err, planned.cfg.dir)
                if line is None:
                    raise
                _fail(UsageError(line), debug)
    except SystemExit:
        if sweep:  # a later job failed: say what still runs
            for run_dir in dict.fromkeys(launched.run_dir.store.root for launched in sweep):
                print(
                    "[pdbench] this sweep's jobs already submitted keep running; follow them "
                    f"with: python -m pdbench status dir={run_dir}",
                    file=sys.stderr,
                )
        raise
    if sweep and not finish_sweep(sweep):
        raise SystemExit(1)


def main(argv: list[str]) -> None:
    """``python -m pdbench ARGV`` (but ``--help``: ``pdbench.help``)."""
    debug = _debug(argv)
    if debug:  # what the driver's deeper parts read (a job's failure shown whole)
        os.environ[DEBUG_ENV] = "1"
    argv = [a for a in argv if a != DEBUG_FLAG]
    inv = parse_argv(argv)
    jobs = Jobs()
    if not inv.show_only:
        try:
            jobs = precheck(inv)
        except UsageError as err:
            _fail(err, debug)
    if not (inv.show_only or inv.shows_config):
        print_warnings(jobs)
    if inv.check_only:
        refused = launch_refusals(jobs, LaunchOrigin.of(argv))
        if refused:
            _fail(
                UsageError(f"{len(refused)} problem(s) in the config:\n" + "\n".join(refused)),
                debug,
            )
        print_checked(jobs)
        if inv.shows_config:  # check --cfg job: validated, then printed as Hydra prints it
            _hydra_prints(inv.argv, debug)
        return
    if inv.show_only or inv.shows_config:
        _hydra_prints(inv.argv, debug)
        return
    run_jobs(jobs, LaunchOrigin.of(argv), inv.multirun, debug)
