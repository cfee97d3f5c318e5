"""The typer application shared by every command module, and the error-to-exit-code edge.

Exit codes (README, "Exit codes"): 0 plans found / success, 1 nothing fits (nearest miss
printed), 2 bad input (one line naming field, value and expectation), 3 solver failure or
time limit (best plan found so far printed), 4 an internal error (a bug: one line, the
traceback with ``--debug``), 130 interrupted.
"""

from __future__ import annotations

import os
import sys

import typer

from planner.errors import InputError, NoFeasiblePlan, SolverFailure

__all__ = ["app", "main", "fail"]

app = typer.Typer(
    name="planner",
    help="Parallelism auto-planner for training large models: predict, search, emit launch configs.",
    no_args_is_help=False,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        from planner import __version__  # noqa: PLC0415

        typer.echo(f"planner {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", "-V", help="Print the version and exit.", callback=_version, is_eager=True),
    debug: bool = typer.Option(False, "--debug", help="Show a traceback instead of the one-line error (any position)."),
    time_limit: float = typer.Option(30.0, "--time-limit", help="Seconds the search may take before exit 3 with the best plans so far (any position)."),
) -> None:
    """Parallelism auto-planner for training large models: predict, search, emit launch configs.

    Start with `planner plan` (a built-in example), then `planner plan --help`.
    Exit codes: 0 plans found, 1 nothing fits (nearest miss printed), 2 bad input, 3 solver time limit,
    4 internal error (rerun with --debug for the traceback).
    """
    # --debug and --time-limit are taken out of the arguments by main() wherever they appear;
    # they are declared here so that --help lists them.


def fail(message: str, code: int = 2) -> None:
    """Print one line on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _time_limit(args: list[str]) -> tuple[list[str], float | None]:
    """Take ``--time-limit SECONDS`` (or ``--time-limit=SECONDS``) out of ``args``: it bounds
    every search the command runs (default 30 s; exit 3 with the best plan so far when hit)."""
    rest, value = [], None
    it = iter(range(len(args)))
    for i in it:
        a = args[i]
        if a == "--":
            rest.extend(args[i:])
            break
        if a == "--time-limit" or a.startswith("--time-limit="):
            raw = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else None)
            if "=" not in a:
                next(it, None)
            try:
                value = float(raw)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise InputError("--time-limit", raw, "a positive number of seconds") from None
            if not (0 < value < float("inf")):
                raise InputError("--time-limit", raw, "a positive finite number of seconds")
            continue
        rest.append(a)
    return rest, value


def _partial_plans(best: object) -> list[dict]:
    """The best plans found before a time limit (not proven best), for the planner-error/1
    document of exit 3: rank, resolved parallel configuration, layer split, step time, memory."""
    return [{"rank": p.rank, "engine": p.estimate.engine, "parallel": p.parallel.as_dict(), "layers_per_stage": list(p.estimate.layers_per_stage),
             "step_time_s": p.estimate.step_time_s, "memory_peak_bytes": p.estimate.memory_peak_bytes}
            for p in getattr(best, "plans", None) or []]


def _print_partial(best: object) -> None:
    """The best plans found before a time limit, one line each, on stdout."""
    for p in getattr(best, "plans", None) or []:
        par, est = p.parallel, p.estimate
        typer.echo(
            f"{p.rank}: tp={par.tp} pp={par.pp} dp={par.dp} cp={par.cp} ep={par.ep} vpp={par.vpp} mb={par.micro_batch_size} "
            f"recompute={par.recompute} sp={par.sequence_parallel} zero={par.zero} layers_per_stage={list(est.layers_per_stage)} "
            f"step {est.step_time_s:.4g} s, {est.memory_peak_bytes / 2**30:.1f} GiB per GPU"
        )


def _usage_message(exc) -> str:
    """Click's usage error in one line; an unknown option names the closest meaning
    (``--tensor-parallel`` -> ``--tp``, :func:`planner.errors.suggest`) instead of click's
    closest spelling (``--sequence-parallel``)."""
    name = getattr(exc, "option_name", None)
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoSuchOption" and name and ctx is not None and ctx.command is not None:
        from planner.errors import suggest  # noqa: PLC0415

        opts = [o for p in ctx.command.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
                if o.startswith("--")]
        hint = suggest(name, opts)
        path = ctx.command_path.split(" ", 1)[1] if " " in ctx.command_path else ctx.command.name  # "models list", not "list"
        return f"no such option: {name}" + (f" ({hint})" if hint else f" (planner {path} --help)")
    return " ".join(exc.format_message().split())


# What a typed option expects, by pydantic's error type (typer coerces option values with
# pydantic and raises click's BadParameter from its ValidationError), in the got/expected
# wording of the planner's own input errors.
_EXPECTED_BY_ERROR = {"int_parsing": "an integer", "int_from_float": "an integer", "float_parsing": "a number",
                      "bool_parsing": "true or false"}


def _bad_value(exc, args: list[str]) -> tuple[str, str, str] | None:
    """(flag, value, expected) of a value typer could not convert (``--gpus abc``), or None
    when the error is another usage error. typer >= 0.2x coerces with pydantic (the value and
    the type are on the ValidationError it raises from); older typer leaves it to click, whose
    parameter type names the kind and whose value is read back from the command line."""
    param, cause = getattr(exc, "param", None), exc.__cause__
    if type(exc).__name__ != "BadParameter" or param is None:
        return None
    names = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
    opts = [o for o in names if o.startswith("--")]
    if not opts:
        return None
    if hasattr(cause, "errors"):
        errors = cause.errors()
        expected = _EXPECTED_BY_ERROR.get(errors[0].get("type", "")) if errors else None
        return (opts[0], str(errors[0].get("input")), expected) if expected else None
    expected = {"integer": "an integer", "float": "a number"}.get(getattr(getattr(param, "type", None), "name", ""))
    for i, a in enumerate(args):  # click: the value as given on the command line
        for o in names:
            if a == o and i + 1 < len(args):
                return (opts[0], args[i + 1], expected) if expected else None
            if o.startswith("--") and a.startswith(o + "="):
                return (opts[0], a[len(o) + 1:], expected) if expected else None
    return None


def _error_doc(exit_code: int, error: str, **extra) -> None:
    """The ``planner-error/1`` document of an exit 1 (``hints``) or 2 (``field``, ``value``,
    ``expected``) on stdout, for ``--json`` callers: scripts reading stdout get a document."""
    import json as _json  # noqa: PLC0415

    typer.echo(_json.dumps({"schema": "planner-error/1", "exit_code": exit_code, "error": error, **extra}))


def _input_error_doc(error: str, field=None, value=None, expected=None) -> None:
    plain = value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
    _error_doc(2, error, field=field, value=plain, expected=expected)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the app and maps exceptions to exit codes."""
    import planner.cli  # noqa: F401,PLC0415  (registers the commands)
    from planner.cli.common import SCENARIO_RUN  # noqa: PLC0415
    from planner.search.plan import TIME_LIMIT_S  # noqa: PLC0415

    def where(message: str) -> str:  # the scenario run the error is about, when one was read
        run = SCENARIO_RUN.get()
        return f"{message} ({run})" if run and run not in message else message

    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or os.environ.get("PLANNER_DEBUG")
    args = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--debug"]
    token = None
    rc = None
    run_token = SCENARIO_RUN.set(None)  # each call names only the run it read
    try:
        args, limit = _time_limit(args)
        if limit is not None:
            token = TIME_LIMIT_S.set(limit)
        # With standalone_mode=False click hands back typer.Exit's code instead of raising it.
        rc = app(args=args, prog_name="planner", standalone_mode=False)
    except InputError as exc:
        if debug:
            raise
        exc = exc.as_flag()  # the library names its argument (model), the command line its flag (--model)
        typer.echo(f"error: {where(str(exc))}", err=True)
        if "--json" in args:
            _input_error_doc(where(str(exc)), exc.field, exc.value, exc.expected)
        return 2
    except NoFeasiblePlan as exc:
        if debug:
            raise
        typer.echo(f"no plan fits: {where(str(exc))}", err=True)
        for hint in exc.hints:
            typer.echo(f"  hint: {hint}", err=True)
        if "--json" in args:
            _error_doc(1, str(exc), hints=exc.hints)
        return 1
    except SolverFailure as exc:
        if debug:
            raise
        typer.echo(f"solver: {exc}", err=True)
        if "--json" in args:  # a JSON reader gets a document, with the plans found so far
            _error_doc(3, str(exc), plans=_partial_plans(exc.best))
        else:
            _print_partial(exc.best)
        return 3
    except typer.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        # A closed stdout (EPIPE: `planner ... | head`): rich's console raises StdoutClosed
        # (planner.report.tables), click answers with sys.exit(1) after wrapping sys.stdout in its
        # PacifyFlushWrapper; 1 means "nothing fits" here, so both say 141 (128 + SIGPIPE)
        if exc.code == 141 or type(sys.stdout).__name__ == "PacifyFlushWrapper":
            return 141
        raise
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        return 130
    except Exception as exc:  # click usage errors (typer vendors its own click) and anything unexpected
        names = {c.__name__ for c in type(exc).__mro__}
        if "NoArgsIsHelpError" in names:  # a command group called bare: click has printed its help
            return 0
        if "UsageError" in names:
            bad = _bad_value(exc, args)
            if bad is not None:  # a value of the wrong type: the planner's got/expected wording
                flag, value, expected = bad
                message = f"{flag}: got {value!r}, expected {expected}"
                typer.echo(f"error: {message}", err=True)
                if "--json" in args:
                    _input_error_doc(message, flag, value, expected)
                return 2
            typer.echo(f"error: {_usage_message(exc)}", err=True)
            if "--json" in args:
                _input_error_doc(_usage_message(exc))
            return 2
        if "ClickException" in names:
            typer.echo(f"error: {exc.format_message()}", err=True)
            return getattr(exc, "exit_code", 1)
        if debug:
            raise
        typer.echo(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)", err=True)
        return 4
    finally:
        SCENARIO_RUN.reset(run_token)
        if token is not None:
            TIME_LIMIT_S.reset(token)
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0
