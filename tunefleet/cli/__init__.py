"""The ``tunefleet`` command line.

:mod:`~tunefleet.cli.app` builds the parser from the command modules and runs a command (``main``).
One module per group of commands: :mod:`~tunefleet.cli.config_db` (config, db),
:mod:`~tunefleet.cli.catalog` (ingest, extract, models, workloads, hardware),
:mod:`~tunefleet.cli.tuning` (plan, tune, shards), :mod:`~tunefleet.cli.run` (run),
:mod:`~tunefleet.cli.delivery` (best, build, export-db), :mod:`~tunefleet.cli.hub` (hub),
:mod:`~tunefleet.cli.registry` (serve, token), :mod:`~tunefleet.cli.learning` (dataset, gc,
costmodel), :mod:`~tunefleet.cli.reports` (report, metrics) and :mod:`~tunefleet.cli.cluster`
(deploy). They share :mod:`~tunefleet.cli.common` (argparse helpers), :mod:`~tunefleet.cli.render`
(tables, JSON, reports), :mod:`~tunefleet.cli.environment` (Prefect's environment, the log file,
``run``'s preflight), :mod:`~tunefleet.cli.interrupt` (Ctrl-C), :mod:`~tunefleet.cli.progress`
(the live line) and :mod:`~tunefleet.cli.plots` (charts), and reach the core through
:mod:`tunefleet.api`.
"""
