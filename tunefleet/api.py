"""tunefleet's Python API: the few calls the CLI, a notebook and a script share.

Examples
--------
Tune a zoo model on this machine's CPU class and build it with what was measured (shards are
planned in between, e.g. with ``tunefleet plan --hardware x86 --trials 64``):

>>> from tunefleet import api
>>> ctx = api.connect()  # settings from TUNEFLEET_* and the config file
>>> model = api.ingest(ctx, "mlp").model
>>> api.extract(ctx, model, "x86")
>>> api.tune(ctx, "x86")
>>> report = api.build(ctx, model, "x86", output="mlp-x86.so")

Each call is a thin layer over the core (:mod:`tunefleet.models`, :mod:`tunefleet.engine`,
:mod:`tunefleet.delivery`) on one :class:`~tunefleet.context.Context`. Importing this module is
cheap: TVM, torch, onnx and the database load inside the calls that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tunefleet.context import Context

if TYPE_CHECKING:
    from collections.abc import Sequence
    from contextlib import AbstractContextManager
    from pathlib import Path

    from tunefleet.budget import Budget
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.db.tables import Model
    from tunefleet.delivery.best import BestSchedule, WorkloadBest
    from tunefleet.delivery.build import BuildReport
    from tunefleet.engine.loop import TuneSummary
    from tunefleet.engine.options import TuneOptions
    from tunefleet.learning.hub import ExportResult, ImportResult, MergeResult
    from tunefleet.models.ingest import IngestResult
    from tunefleet.models.workloads import ExtractResult
    from tunefleet.planning.rounds import Deadline, Rounds

__all__ = ["Context", "best", "best_for", "build", "build_exported", "connect", "extract", "hub_export", "hub_import",
           "hub_merge", "ingest", "keeping_models", "tune", "tune_with_workers"]


def connect(settings: Settings | None = None) -> Context:
    """Open a context: the database (hardware classes seeded) and the artifact store, on first use.

    Parameters
    ----------
    settings : Settings, optional
        The configuration; default: loaded from ``TUNEFLEET_*`` and the config file
        (:func:`tunefleet.config.load_settings`).

    Returns
    -------
    Context
        Lazily opened; :meth:`Context.close` closes its connections and tuners.
    """
    if settings is None:
        from tunefleet.config import load_settings

        settings = load_settings()
    return Context(settings)


def _model(db: Database, model: Model | int | str) -> Model:
    """A stored model from a model, an id, a name or a sha256 prefix."""
    return db.model(model) if isinstance(model, (int, str)) else model


def ingest(ctx: Context, source: str, *, name: str | None = None, batch_size: int = 1,
           image_size: int | None = None, seq_len: int | None = None) -> IngestResult:
    """Store a model once; ingesting the same bytes again returns the stored one.

    Parameters
    ----------
    ctx : Context
        From :func:`connect`.
    source : str
        A zoo name (``resnet18``, ``mlp``, ...), a path to an ONNX or ``.pt2`` file, or an
        ``s3://`` URI in the configured artifact store.
    name : str, optional
        The name to store it under; default the zoo name or the file's stem.
    batch_size, image_size, seq_len : int, optional
        Zoo models only: the input shapes.

    Returns
    -------
    IngestResult
        ``model`` (the stored row), ``created`` (False when it was stored already) and ``loaded``.
    """
    from tunefleet.models.ingest import ingest as ingest_model
    from tunefleet.models.kept import keep_loaded

    res = ingest_model(ctx.db, ctx.store, source, name=name, batch_size=batch_size, image_size=image_size,
                       seq_len=seq_len)
    keep_loaded(res.model, res.loaded)  # within keeping_models(), extract() takes this parse
    return res


def keeping_models() -> AbstractContextManager[None]:
    """A block within which each model is loaded and extracted once.

    A model file is parsed in a child process that must import TVM first (seconds, whatever the
    file's size); :func:`ingest` parses it, and :func:`extract` would parse it again. Within this
    block, :func:`extract` and :func:`build` take the model :func:`ingest` loaded, and a model
    extracted once per target and recipe is not extracted again. What is kept is dropped at the
    block's end: wrap the models of one unit of work, not a whole campaign of them.

    Examples
    --------
    >>> with api.keeping_models():
    ...     model = api.ingest(ctx, "conv.onnx").model
    ...     api.extract(ctx, model, "x86")  # no second parse
    """
    from tunefleet.models.kept import keeping_models as keeping

    return keeping()


def extract(ctx: Context, model: Model | int | str, hardware: str) -> ExtractResult:
    """Extract a model's tuning tasks for a hardware class and store its workloads once.

    Parameters
    ----------
    ctx : Context
        From :func:`connect`.
    model : Model, int or str
        A stored model, or its id, name or sha256 prefix.
    hardware : str
        The hardware class (``tunefleet hardware list``).

    Returns
    -------
    ExtractResult
        How many workloads the model has on the class, and how many were new.
    """
    from tunefleet.models.workloads import extract as extract_workloads

    db, store = ctx.db, ctx.store
    return extract_workloads(db, store, _model(db, model), hardware)


def tune(ctx: Context, hardware: str, options: TuneOptions | None = None, *, budget: str | int | None = None,
         models: Sequence[Model | int | str] | None = None, max_shards: int | None = None,
         rounds: Rounds | None = None, deadline: Deadline | None = None) -> TuneSummary:
    """Lease and tune the pending shards of a hardware class in this process until none is left,
    or spend a budget on models (planned in rounds as ``tunefleet tune --budget`` does).

    Parameters
    ----------
    ctx : Context
        From :func:`connect`.
    hardware : str
        The hardware class whose queue to drain.
    options : TuneOptions, optional
        Default: the settings' (:meth:`Context.options`).
    budget : str or int, optional
        A number of trials (``2000``: ``models`` needed) or a wall time (``"15m"``), spent on the
        workloads of ``models`` in rounds; a wall time alone stops draining the queue then.
    models : sequence of Model, int or str, optional
        The models the budget is for (extracted for the class already).
    max_shards : int, optional
        Stop after this many shards.
    rounds : Rounds, optional
        A model's budget built by hand (instead of ``budget``): an empty queue plans its next
        round until the budget is spent.
    deadline : Deadline, optional
        Stop leasing at this time (default the rounds' deadline, if any).

    Returns
    -------
    TuneSummary
        Shards done and failed, candidates measured, and why draining stopped.

    Raises
    ------
    ParameterError
        A budget that does not parse, a number of trials without models, models without a
        budget, or ``budget`` together with ``rounds`` or ``deadline``.
    """
    from tunefleet.engine.worker import drain

    options = options if options is not None else ctx.options()
    if budget is not None or models:
        from tunefleet.errors import ParameterError
        from tunefleet.planning.spend import TUNE, Spend

        if rounds is not None or deadline is not None:
            raise ParameterError("invalid parameters: give budget (and models), or rounds and deadline, not both")
        ids = [_model(ctx.db, m).id for m in models or ()]
        spend = Spend.request(TUNE, None if budget is None else str(budget), model_ids=ids, name="budget")
        rounds, deadline = spend.tuning(hardware, batch=options.trials_per_iter, energy_aware=options.energy_aware)
    return drain(ctx.db, hardware, options, max_shards=max_shards, store=ctx.store, refill=rounds, deadline=deadline)


def tune_with_workers(ctx: Context, hardware: str, options: TuneOptions | None = None, *, workers: int = 2,
                      max_shards: int | None = None, rounds: Rounds | None = None,
                      deadline: Deadline | None = None) -> list[int]:
    """Drain a hardware class's queue with local worker processes that share the database.

    Parameters
    ----------
    ctx : Context
        From :func:`connect`; the workers open their own connections from its settings.
    hardware : str
        The hardware class whose queue to drain.
    options : TuneOptions, optional
        Default: the settings' (:meth:`Context.options`).
    workers : int, optional
        Worker processes (default 2).
    max_shards : int, optional
        Each worker stops after this many shards.
    rounds : Rounds, optional
        A model's budget; its trials are counted over all the workers.
    deadline : Deadline, optional
        Every worker stops leasing at this time.

    Returns
    -------
    list of int
        The workers' exit codes (0: the queue was drained).
    """
    from tunefleet.engine.worker import tune_with_workers as run_workers

    options = options if options is not None else ctx.options()
    return run_workers(ctx.settings, hardware, options, workers=workers, max_shards=max_shards, refill=rounds,
                       deadline=deadline)


def build(ctx: Context, model: Model | int | str, hardware: str, *, output: str | Path | None = None,
          zero_shot: bool = False, top_k: int = 5, verify: Budget | int | str | None = None,
          transfer: bool = False, confirm_top: int | None = None) -> BuildReport:
    """Compile a model with the best stored schedules and time it against the untuned build.

    Parameters
    ----------
    ctx : Context
        From :func:`connect`.
    model : Model, int or str
        A stored model, or its id, name or sha256 prefix.
    hardware : str
        The hardware class to build for.
    output : str or Path, optional
        Write the compiled library here (default: not written).
    zero_shot : bool, optional
        Workloads never measured on the class get the current cost model's best proposal (the
        class's promoted model, else the shipped one unless ``pretrained_cost_model`` is off).
    top_k : int, optional
        With ``zero_shot``: proposals stored per workload (default 5).
    verify : Budget, int or str, optional
        With ``zero_shot``: measure proposals here within this budget in all, a candidate count or
        a wall time (``"90s"``: the proposals' search and their verification together), the
        heaviest workloads' best-scored first; each workload measured so is built with its best
        measured schedule. None: ``DEFAULT_VERIFY`` (90 s); 0: pure prediction.
    transfer : bool, optional
        Workloads still without a schedule use the most compatible class's best one.
    confirm_top : int, optional
        Re-time each workload's this many fastest schedules side by side here first and build with
        the fastest re-timed one (:mod:`tunefleet.delivery.confirm`); None: the ``confirm_top``
        setting (default 0: build with the fastest records).

    Returns
    -------
    BuildReport
        The latencies (untuned, tuned, and the alternatives) and what each workload was built with.
    """
    from tunefleet.delivery.build import build_model
    from tunefleet.delivery.zeroshot import DEFAULT_VERIFY, parse_verify

    db, store = ctx.db, ctx.store
    if verify is None and zero_shot:
        verify = DEFAULT_VERIFY
    if verify is not None:
        verify = parse_verify(verify)
    return build_model(db, store, _model(db, model), hardware, output=output, zero_shot=zero_shot, top_k=top_k,
                       verify=verify, transfer=transfer, pretrained=ctx.settings.pretrained_cost_model,
                       confirm_top=ctx.settings.confirm_top if confirm_top is None else confirm_top)


def best(ctx: Context, workload: str, hardware: str, n: int = 1) -> list[BestSchedule]:
    """The ``n`` best measured schedules of a workload on a hardware class.

    Parameters
    ----------
    ctx : Context
        From :func:`connect`.
    workload : str
        The workload's structural hash, or a unique prefix of it.
    hardware : str
        The hardware class.
    n : int, optional
        How many schedules, best first (default 1).

    Returns
    -------
    list of BestSchedule

    Raises
    ------
    NotFoundError
        The workload was never measured on the class.
    """
    from tunefleet.delivery.best import best as best_schedules

    return best_schedules(ctx.db, workload, hardware, n=n)


def hub_export(ctx: Context, output: str | Path, *, hardware: list[str] | None = None,
               model: Model | int | str | None = None, top_k: int | None = None) -> ExportResult:
    """Write a hub bundle: the best records of every measured workload, per hardware class.

    Parameters
    ----------
    ctx : Context
        From :func:`connect`.
    output : str or Path
        A file path, or an ``s3://`` URI of the artifact store's bucket.
    hardware : list of str, optional
        Only these classes (default: every class of the database but the hub classes).
    model : Model, int or str, optional
        Only this model's workloads (under each class's recipe).
    top_k : int, optional
        Records per workload and class (default :data:`tunefleet.learning.hub.DEFAULT_TOP_K`).

    Returns
    -------
    ExportResult
    """
    from tunefleet.learning.hub import DEFAULT_TOP_K, write_bundle

    db = ctx.db
    wanted = None
    if model is not None:
        m = _model(db, model)
        wanted = {hw.name: {wl.id for wl, _ in db.workloads(m.id, hw.id)} for hw in db.hardware_classes()}
    store = ctx.store if str(output).startswith("s3://") else None  # a file needs no store (nor its S3 endpoint)
    return write_bundle(db, store, output, hardware=hardware, workload_ids=wanted,
                        top_k=DEFAULT_TOP_K if top_k is None else top_k)


def hub_merge(ctx: Context, output: str | Path, sources: list[str | Path], *, exclude: list[str] | None = None,
              top_k: int | None = None) -> MergeResult:
    """Write one hub bundle of the records of several: per workload, class and CPU, the ``top_k``
    fastest distinct schedules (e.g. one campaign's bundle per CPU, shipped as one file). No
    database is opened.

    Parameters
    ----------
    ctx : Context
        From :func:`connect` (its artifact store for ``s3://``, its registry token for ``https://``).
    output : str or Path
        A file path, or an ``s3://`` URI of the artifact store's bucket.
    sources : list of str or Path
        Bundles: file paths, ``s3://`` URIs, or a schedule registry's ``https://`` URLs.
    exclude : list of str, optional
        ``fnmatch`` patterns of workload names whose records are left out (records known to be wrong).
    top_k : int, optional
        Records kept per workload, class and CPU (default :data:`tunefleet.learning.hub.DEFAULT_TOP_K`).

    Returns
    -------
    MergeResult
        What was written and left out (:meth:`~tunefleet.learning.hub.MergeResult.line`).

    Raises
    ------
    tunefleet.errors.ParameterError
        A source that is not a bundle, or every record excluded.
    tunefleet.errors.NotSupportedError
        Another format version, or sources of different TVM versions.
    """
    from tunefleet.learning.hub import DEFAULT_TOP_K, write_merged

    uses_s3 = any(str(x).startswith("s3://") for x in [output, *sources])
    token = ctx.settings.registry_token.get_secret_value() or None
    return write_merged(sources, output, store=ctx.store if uses_s3 else None, token=token, exclude=exclude,
                        top_k=DEFAULT_TOP_K if top_k is None else top_k)


def hub_import(ctx: Context, source: str | Path) -> ImportResult:
    """Load a hub bundle (a file path, an ``s3://`` URI of the artifact store, or a schedule
    registry's ``https://`` URL, fetched with the ``registry_token`` setting and checked against the
    SHA-256 the registry sends): validated, in one transaction, idempotent. Its records go under
    hub classes that tuning starts from.

    Returns
    -------
    ImportResult
        What was added and skipped (:meth:`~tunefleet.learning.hub.ImportResult.line`).
    """
    from tunefleet.learning.hub import import_bundle

    token = ctx.settings.registry_token.get_secret_value() or None
    return import_bundle(ctx.db, source, store=ctx.store if str(source).startswith("s3://") else None, token=token)


def best_for(ctx: Context, what: Model | int | str | Any, hardware: str, *, n: int = 1,
             params: dict[str, Any] | None = None) -> list[WorkloadBest]:
    """The best measured schedules of every workload of a model, or of your own Relax module, on a
    hardware class: the structural hashes are computed for you under the class's recipe.

    Parameters
    ----------
    ctx : Context
        From :func:`connect`.
    what : Model, int, str or tvm.IRModule
        A stored model (or its id, name or sha256 prefix), extracted for the class already; or a
        Relax ``IRModule``, whose workloads are extracted here (nothing is stored).
    hardware : str
        The hardware class.
    n : int, optional
        Schedules per workload, best first (default 1).
    params : dict of str to array, optional
        With an ``IRModule``: the weights to bind (prepacking folds them into the workloads).

    Returns
    -------
    list of WorkloadBest
        One per workload, heaviest call count first; ``schedules`` is empty for a workload the
        class never measured.

    Raises
    ------
    NotFoundError
        An unknown model or class, or a stored model never extracted for the class.
    """
    from tunefleet.db.tables import Model as StoredModel
    from tunefleet.delivery.best import best_for_workloads

    db = ctx.db
    hw = db.hardware_class(hardware)
    if isinstance(what, (int, str, StoredModel)):
        model = _model(db, what)
        linked = db.workloads(model.id, hw.id)
        if not linked:
            from tunefleet.errors import NotFoundError

            raise NotFoundError(f"model {model.name} has no workloads on {hardware}: extract it first "
                                f"(`tunefleet extract {model.name} --hardware {hardware}`)")
        workloads = [(wl.structural_hash, wl.name, int(weight)) for wl, weight in linked]
    else:
        from tunefleet.models.workloads import class_recipe
        from tunefleet.tvm.extract import extract_workloads
        from tunefleet.tvm.targets import make_target

        found = extract_workloads(what, make_target(hw.target), params=params, recipe=class_recipe(hw))
        workloads = [(w.structural_hash, w.name, int(w.weight)) for w in found]
    workloads.sort(key=lambda w: -w[2])
    return best_for_workloads(db, workloads, hardware, n=n)


def build_exported(mod: Any, directory: str | Path, *, params: dict[str, Any] | None = None,
                   func_name: str | None = None) -> Any:
    """Build your own Relax module with the records ``tunefleet export-db`` wrote to a directory:
    no database and no settings, only tunefleet and TVM installed (the directory's
    ``tunefleet.json`` names the target and the extraction recipe the records need).

    Parameters
    ----------
    mod : tvm.IRModule
        The model as its frontend gave it (weights bound, or given as ``params``).
    directory : str or Path
        What ``export-db`` wrote.
    params : dict of str to array, optional
        The weights to bind, by parameter name.
    func_name : str, optional
        The Relax function ``params`` belong to.

    Returns
    -------
    tunefleet.tvm.compile.BuildResult
        ``executable`` (run it with ``tvm.relax.VirtualMachine(executable, tvm.cpu())``) and
        ``hits`` (the functions built from the records; the others keep the default schedule).
    """
    from tunefleet.delivery.best import build_exported as build

    return build(mod, directory, params=params, func_name=func_name)
