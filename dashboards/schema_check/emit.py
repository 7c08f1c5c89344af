"""Write ``check.ts``: every dashboard JSON as an object literal typed by ``@grafana/schema``.

Why emit a file instead of ``import energy from '../energy.json'``: a JSON import widens every
string to ``string``, so a correct dashboard fails against literal unions such as
``repeatDirection: "h" | "v"``. Emitting the JSON text itself as the initializer of
``const x: CheckedDashboard = {...}`` lets TypeScript type each literal in context, and an
object literal also gets excess-property checks (a misspelt or unknown key is an error).

What the type checks (all from @grafana/schema, see ``HEADER``):

* the dashboard against ``Dashboard`` (panels ``Panel``/``RowPanel``, ``templating.list``
  ``VariableModel``, ``annotations``, ``time``, ...);
* each panel whose ``type`` is a core plugin in ``PLUGINS`` additionally against that plugin's
  ``Options`` and (where it has one) ``FieldConfig`` for ``fieldConfig.defaults.custom``;
  panels of other types get the generic ``Panel`` (``options`` unchecked);
* string enums (``BigValueColorMode``, ``ThresholdsMode``, ...) as their JSON values
  (``"value"``, ``"absolute"``): a JSON file cannot hold an enum member, only its value.

Not checked (``Record<string, unknown>``/``any`` in the schema): ``targets`` (there is no
Prometheus query type in @grafana/schema), transformation options, override property values.

One allowance (``SDK_VARIABLE_EXTRAS``, off with ``--strict``): grafana-foundation-sdk's
``VariableModel`` writes ``auto``, ``auto_count`` and ``auto_min`` (interval-variable settings)
on every variable, and @grafana/schema's ``VariableModel`` does not declare them. They are
still type-checked (boolean, number, string), only not rejected as unknown keys.

Every emitted line that holds a value ends with ``// <file> $.json.path``, so an error that tsc
reports at ``check.ts(LINE,COL)`` can be traced to the field in the dashboard:
``annotate()``, or ``tsc -p . | python3 emit.py --annotate``.

Standard library only::

    python3 emit.py                        # ../energy.json ../cost.json ../tuning.json -> check.ts
    python3 emit.py --out X.ts A.json ...  # other files (the tests use this for broken copies)
    npx tsc -p .                           # tsconfig.json checks check.ts
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DASHBOARDS = [HERE.parent / name for name in ("energy.json", "cost.json", "tuning.json")]
CHECK_TS = HERE / "check.ts"

#: Panel plugin id -> its types in @grafana/schema (dist/esm/raw/composable/<path>), and whether
#: that module exports a ``FieldConfig`` (the type of ``fieldConfig.defaults.custom``).
PLUGINS: dict[str, tuple[str, bool]] = {
    "annolist": ("annotationslist/panelcfg/x/AnnotationsListPanelCfg_types.gen", False),
    "barchart": ("barchart/panelcfg/x/BarChartPanelCfg_types.gen", True),
    "bargauge": ("bargauge/panelcfg/x/BarGaugePanelCfg_types.gen", False),
    "candlestick": ("candlestick/panelcfg/x/CandlestickPanelCfg_types.gen", True),
    "canvas": ("canvas/panelcfg/x/CanvasPanelCfg_types.gen", False),
    "dashlist": ("dashboardlist/panelcfg/x/DashboardListPanelCfg_types.gen", False),
    "gauge": ("gauge/panelcfg/x/GaugePanelCfg_types.gen", False),
    "geomap": ("geomap/panelcfg/x/GeomapPanelCfg_types.gen", False),
    "heatmap": ("heatmap/panelcfg/x/HeatmapPanelCfg_types.gen", True),
    "histogram": ("histogram/panelcfg/x/HistogramPanelCfg_types.gen", True),
    "logs": ("logs/panelcfg/x/LogsPanelCfg_types.gen", False),
    "news": ("news/panelcfg/x/NewsPanelCfg_types.gen", False),
    "nodeGraph": ("nodegraph/panelcfg/x/NodeGraphPanelCfg_types.gen", False),
    "piechart": ("piechart/panelcfg/x/PieChartPanelCfg_types.gen", True),
    "stat": ("stat/panelcfg/x/StatPanelCfg_types.gen", False),
    "state-timeline": ("statetimeline/panelcfg/x/StateTimelinePanelCfg_types.gen", True),
    "status-history": ("statushistory/panelcfg/x/StatusHistoryPanelCfg_types.gen", True),
    "table": ("table/panelcfg/x/TablePanelCfg_types.gen", True),
    "text": ("text/panelcfg/x/TextPanelCfg_types.gen", False),
    "timeseries": ("timeseries/panelcfg/x/TimeSeriesPanelCfg_types.gen", True),
    "trend": ("trend/panelcfg/x/TrendPanelCfg_types.gen", True),
}

#: Keys grafana-foundation-sdk writes on every template variable that @grafana/schema's
#: VariableModel lacks, with the TypeScript type they are checked against.
SDK_VARIABLE_EXTRAS = {"auto": "boolean", "auto_count": "number", "auto_min": "string"}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _header(strict: bool) -> str:
    imports = "\n".join(
        f"import type * as P{i} from '@grafana/schema/dist/esm/raw/composable/{path}';"
        for i, (path, _) in enumerate(PLUGINS.values())
    )
    plugins = "\n".join(
        f"  {json.dumps(pid)}: {{ options: P{i}.Options; custom: "
        f"{f'P{i}.FieldConfig' if has_custom else 'Record<string, unknown>'} }};"
        for i, (pid, (_, has_custom)) in enumerate(PLUGINS.items())
    )
    extras = "{}" if strict else "{ " + " ".join(f"{k}?: {t};" for k, t in SDK_VARIABLE_EXTRAS.items()) + " }"
    return f"""\
// Generated by dashboards/schema_check/emit.py from dashboard JSON. Do not edit, do not commit.
import type * as S from '@grafana/schema';
{imports}

/** T as JSON holds it: string enums become their values; `any` and `unknown` stay. */
type JsonOf<T> =
  0 extends 1 & T ? T :
  T extends string ? (string extends T ? T : `${{T}}`) :
  T extends readonly (infer U)[] ? JsonOf<U>[] :
  T extends object ? {{ [K in keyof T]: JsonOf<T[K]> }} :
  T;

/** Core panel plugins: `options` and `fieldConfig.defaults.custom` types. */
interface Plugins {{
{plugins}
}}

type FieldConfigSourceOf<C> = Omit<JsonOf<S.FieldConfigSource>, 'defaults'> & {{
  defaults: Omit<JsonOf<S.FieldConfig>, 'custom'> & {{ custom?: JsonOf<C> }};
}};

type PluginPanel<T extends keyof Plugins> = Omit<JsonOf<S.Panel>, 'type' | 'options' | 'fieldConfig'> & {{
  type: T;
  options?: JsonOf<Plugins[T]['options']>;
  fieldConfig?: FieldConfigSourceOf<Plugins[T]['custom']>;
}};

/** `Other`: the panel types of this dashboard that are not in Plugins (checked as plain Panel). */
type AnyPanel<Other extends string> =
  | {{ [T in keyof Plugins]: PluginPanel<T> }}[keyof Plugins]
  | (Omit<JsonOf<S.Panel>, 'type'> & {{ type: Other }});

type Row<Other extends string> = Omit<JsonOf<S.RowPanel>, 'panels'> & {{ panels: AnyPanel<Other>[] }};

/** SDK_VARIABLE_EXTRAS (empty with --strict). */
type VariableExtras = {extras};

type CheckedDashboard<Other extends string> = Omit<JsonOf<S.Dashboard>, 'panels' | 'templating'> & {{
  panels?: (AnyPanel<Other> | Row<Other>)[];
  templating?: {{ list?: (JsonOf<S.VariableModel> & VariableExtras)[] }};
}};
"""


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if _IDENT.match(key) else f"{path}[{json.dumps(key)}]"


def _literal(value: Any, path: str, label: str, indent: int, lines: list[str], prefix: str, suffix: str) -> None:
    """Append ``value`` as TypeScript (JSON syntax), one value per line, each tagged with its path."""
    pad = "  " * indent
    tag = f" // {label} {path}"
    if isinstance(value, dict) and value:
        lines.append(f"{pad}{prefix}{{{tag}")
        items = list(value.items())
        for i, (key, item) in enumerate(items):
            comma = "," if i < len(items) - 1 else ""
            _literal(item, _key_path(path, key), label, indent + 1, lines, f"{json.dumps(key)}: ", comma)
        lines.append(f"{pad}}}{suffix}{tag}")
    elif isinstance(value, list) and value:
        lines.append(f"{pad}{prefix}[{tag}")
        for i, item in enumerate(value):
            comma = "," if i < len(value) - 1 else ""
            _literal(item, f"{path}[{i}]", label, indent + 1, lines, "", comma)
        lines.append(f"{pad}]{suffix}{tag}")
    else:
        # Scalars, {} and []: JSON text is valid TypeScript (ensure_ascii keeps U+2028/U+2029 safe);
        # allow_nan=False rejects the NaN/Infinity that json.loads lets through.
        lines.append(f"{pad}{prefix}{json.dumps(value, allow_nan=False)}{suffix}{tag}")


def _other_panel_types(dashboard: Any) -> list[str]:
    """Panel types in ``dashboard`` (rows included) that are neither ``row`` nor in PLUGINS."""
    found: set[str] = set()
    stack = list(dashboard.get("panels") or []) if isinstance(dashboard, dict) else []
    while stack:
        panel = stack.pop()
        if not isinstance(panel, dict):
            continue
        kind = panel.get("type")
        if isinstance(kind, str) and kind != "row" and kind not in PLUGINS:
            found.add(kind)
        stack.extend(p for p in panel.get("panels") or [] if isinstance(p, dict))
    return sorted(found)


def emit(dashboards: list[Path], out: Path, *, strict: bool = False) -> list[str]:
    """Write ``out`` (TypeScript) checking each JSON file; return the panel types not in PLUGINS."""
    lines = _header(strict).splitlines()
    names: list[str] = []
    unchecked: set[str] = set()
    for i, path in enumerate(dashboards):
        path = Path(path)
        value = json.loads(path.read_text(encoding="utf-8"))
        others = _other_panel_types(value)
        unchecked.update(others)
        name = f"dashboard_{i}_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
        names.append(name)
        other_type = " | ".join(json.dumps(t) for t in others) or "never"
        lines += ["", f"// {path}"]
        _literal(value, "$", path.name, 0, lines, f"const {name}: CheckedDashboard<{other_type}> = ", ";")
    lines += ["", f"export const dashboards = [{', '.join(names)}];"]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sorted(unchecked)


_TSC_LOCATION = re.compile(r"^(?P<file>[^\s(][^(]*)\((?P<line>\d+),(?P<col>\d+)\): ")


def annotate(tsc_output: str, base: Path = HERE) -> str:
    """Append ``  [<file> $.path]`` to each ``FILE(LINE,COL): error ...`` line of tsc's output
    (``--pretty false``, the default when not on a terminal); ``base``: where tsc ran."""
    cache: dict[Path, list[str]] = {}
    result = []
    for line in tsc_output.splitlines():
        match = _TSC_LOCATION.match(line)
        if match:
            file = (base / match["file"]).resolve()
            if file not in cache:
                try:
                    cache[file] = file.read_text(encoding="utf-8").splitlines()
                except OSError:
                    cache[file] = []
            source = cache[file]
            number = int(match["line"])
            if 0 < number <= len(source) and " // " in source[number - 1]:
                line = f"{line}  [{source[number - 1].rsplit(' // ', 1)[1]}]"
        result.append(line)
    return "\n".join(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="*", type=Path, help="dashboard JSON files (default: the three committed ones)")
    parser.add_argument("--out", type=Path, default=CHECK_TS, help="TypeScript file to write (default: check.ts)")
    parser.add_argument("--strict", action="store_true", help="reject SDK_VARIABLE_EXTRAS as unknown keys too")
    parser.add_argument("--annotate", action="store_true", help="read tsc output on stdin, print it with JSON paths")
    args = parser.parse_args(argv)
    if args.annotate:
        print(annotate(sys.stdin.read()))
        return 0
    unchecked = emit([p.resolve() for p in args.json] or DASHBOARDS, args.out, strict=args.strict)
    if unchecked:
        print(f"emit.py: panel types checked as plain Panel (options unchecked): {', '.join(unchecked)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
