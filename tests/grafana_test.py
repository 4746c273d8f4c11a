#!/usr/bin/python3
"""Checks the Grafana dashboard deploy/grafana/tessera.json against docs/metrics.md.

    grafana_test.py [--docs docs/metrics.md] [--dashboard deploy/grafana/tessera.json]
                    [--promtool /usr/bin/promtool] [--no-mutations]

The "Prometheus" table of docs/metrics.md is the contract of the training process's endpoint:
metric names, types and labels. Every expression of every panel must use only those metrics,
label names the metric has (or `job`/`instance`, which Prometheus adds when it scrapes), rate()
and increase() only over counters, and select on the dashboard's $job and $instance; every
documented metric must appear in some panel. Every expression, with the template variables
substituted, must parse with the real promtool (`promtool check rules` over a recording rule per
expression). Structure: unique panel ids, a grid position each, the Prometheus datasource
variable on every panel and target, an expression and a refId on every target, units that fit
the metric.

The checks run on the dashboard as it is (every one must pass), then on mutated copies that each
break one thing (every copy must fail, and by the check meant for it), so a check that can no
longer fail is caught too. Standard library only; promtool comes with Debian's `prometheus`
package (scripts/setup.sh).
"""

import argparse
import copy
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Documented metrics no panel needs to show. Empty: tessera_info and tessera_world_size feed the
# "Runs" table, tessera_max_steps the step stat. Name a metric here, with the reason, to leave it out.
UNUSED_OK = {}

# The labels of the DCGM exporter's GPU families, which Tessera's endpoint uses too.
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}
# Labels every scraped series has whatever the endpoint serves (Prometheus adds them).
SCRAPE_LABELS = {"job", "instance"}
# Every selector must filter on these template variables, or runs would be mixed.
SELECTOR_VARIABLES = ("job", "instance")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

# Grafana's built-in variables and what stands in for them when promtool parses an expression.
BUILTIN_VARIABLES = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h",
                     "__interval_ms": "60000", "__range_ms": "3600000", "__range_s": "3600"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = GROUPING | {"bool", "offset", "and", "or", "unless", "atan2", "inf", "nan"}
COUNTER_FUNCTIONS = {"rate", "irate", "increase", "resets"}
GAUGE_FUNCTIONS = {"delta", "idelta", "deriv", "predict_linear", "holt_winters"}
MATCH_OPS = {"=", "!=", "=~", "!~"}

# Units a metric's name implies (Prometheus base units), for a target showing that metric alone.
SUFFIX_UNITS = [("_bytes", {"bytes", "decbytes"}), ("_seconds", {"s"}), ("_ratio", {"percentunit"}),
                ("_flops_per_second", {"flops"})]
KNOWN_UNITS = {"short", "none", "s", "ms", "bytes", "decbytes", "percentunit", "percent", "sci",
               "flops", "mbytes", "watt", "celsius"}

TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{[^}]*\}|\$\w+|\[\[[^\]]*\]\])
  | (?P<dur>(?:\d+(?:ms|[smhdwy]))+\b)
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<punct>[(){},])
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=@])
""", re.X)


# ---------------------------------------------------------------------------------------------
# docs/metrics.md

def parse_metrics_doc(text):
    """{name: {"type": "gauge"|"counter", "labels": set}} from the tables under "## Prometheus":
    Tessera's own (a labels column), and under its "### GPU metrics" subsection the DCGM
    exporter's families (one or more names per row, every one with DCGM_LABELS)."""
    metrics, in_section, header, dcgm = {}, False, None, False
    for line in text.splitlines():
        if line.startswith("## "):
            in_section = line.strip() == "## Prometheus"
            continue
        if line.startswith("### "):
            header, dcgm = None, line.startswith("### GPU metrics")
            continue
        if not in_section or not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if set("".join(cells)) <= set("-: "):
            continue
        row = dict(zip(header, cells))
        labels = DCGM_LABELS if dcgm else set(re.findall(r"`([^`]+)`", row.get("labels", "")))
        for name in re.findall(r"`([^`]+)`", row["metric"]):
            metrics[name] = {"type": row["type"].split()[0], "labels": set(labels)}
    if not metrics:
        raise SystemExit("docs: no metric table under '## Prometheus'")
    for name, m in metrics.items():
        if m["type"] not in ("gauge", "counter"):
            raise SystemExit(f"docs: {name}: unknown type {m['type']!r}")
        if name.startswith("DCGM_FI_"):  # DCGM's names, kept as they are: no _total rule
            continue
        if (m["type"] == "counter") != name.endswith("_total"):
            raise SystemExit(f"docs: {name}: counters and only counters end in _total")
    return metrics


# ---------------------------------------------------------------------------------------------
# PromQL: just enough to find metrics, label names and their scopes

def tokenize(expr):
    toks, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read PromQL at {expr[pos:pos + 20]!r}")
        if m.lastgroup != "ws":
            toks.append((m.lastgroup, m.group()))
        pos = m.end()
    return toks


def analyse(expr):
    """Metric selectors, label names with their scopes, and range-function arguments of expr.

    Returns {"selectors": [(metric, [(label, op, value)])],
             "groupings": [(keyword, [labels], {metrics in scope})],
             "functions": [(name, {metrics in its arguments})]}.
    """
    toks = tokenize(expr)
    n = len(toks)
    match, stack = {}, []
    for i, (kind, text) in enumerate(toks):
        if text in "({" and kind == "punct":
            stack.append(i)
        elif text in ")}" and kind == "punct":
            if not stack or toks[stack[-1]][1] != {")": "(", "}": "{"}[text]:
                raise ValueError("unbalanced brackets")
            j = stack.pop()
            match[i], match[j] = j, i
    if stack:
        raise ValueError("unbalanced brackets")

    not_metric = set()  # token indices of label names
    selectors = []
    for i, (kind, text) in enumerate(toks):
        if (kind, text) == ("punct", "{"):
            matchers = []
            for k in range(i + 1, match[i]):
                if toks[k][0] == "ident" and k + 2 < match[i] and toks[k + 1][1] in MATCH_OPS:
                    value = toks[k + 2][1][1:-1] if toks[k + 2][0] == "str" else toks[k + 2][1]
                    matchers.append((toks[k][1], toks[k + 1][1], value))
                    not_metric.add(k)
            prev = toks[i - 1] if i > 0 else None
            metric = prev[1] if prev and prev[0] == "ident" and prev[1].lower() not in KEYWORDS else None
            selectors.append((metric, matchers, i - 1 if metric else i))
        elif kind == "ident" and text.lower() in GROUPING and i + 1 < n and toks[i + 1][1] == "(":
            not_metric.update(range(i + 1, match[i + 1]))

    def metrics_in(lo, hi):
        return {toks[k][1] for k in range(lo, hi + 1) if is_metric(k)}

    def is_metric(k):
        kind, text = toks[k]
        following = toks[k + 1][1].lower() if k + 1 < n else None
        return (kind == "ident" and k not in not_metric and text.lower() not in KEYWORDS
                and following != "(" and not (text in AGGREGATIONS and following in ("by", "without")))

    groupings, functions = [], []
    for i, (kind, text) in enumerate(toks):
        low = text.lower()
        if kind != "ident":
            continue
        if low in GROUPING:
            labels = []
            if i + 1 < n and toks[i + 1][1] == "(":
                labels = [t for kk, t in toks[i + 1:match[i + 1]] if kk == "ident"]
            if low in ("by", "without"):
                if i > 0 and toks[i - 1][0] == "ident":  # sum by (l) (expr)
                    start = match[i + 1] + 1
                    scope = metrics_in(start, match[start]) if start < n and start in match else set()
                elif i > 0 and toks[i - 1][1] == ")":  # sum (expr) by (l)
                    scope = metrics_in(match[i - 1], i - 1)
                else:
                    raise ValueError(f"'{text}' without an aggregation")
            else:  # the binary operation's operands: the innermost enclosing parentheses
                opens = [j for j in match if toks[j][1] == "(" and j < i < match[j]]
                lo = max(opens) if opens else 0
                scope = metrics_in(lo, match[lo] if opens else n - 1)
            if labels:
                groupings.append((low, labels, scope))
        elif i + 1 < n and toks[i + 1][1] == "(" and (low in COUNTER_FUNCTIONS or low in GAUGE_FUNCTIONS):
            functions.append((low, metrics_in(i + 1, match[i + 1])))

    plain = [(toks[k][1], [], k) for k in range(n) if is_metric(k)
             and not (k + 1 < n and toks[k + 1][1] == "{")]
    all_selectors = [(m, ms) for m, ms, _ in sorted(selectors + plain, key=lambda s: s[2])]
    return {"selectors": all_selectors, "groupings": groupings, "functions": functions}


def substitute(expr, variables):
    """expr with template variables replaced by values promtool can parse."""
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in BUILTIN_VARIABLES:
            return BUILTIN_VARIABLES[name]
        if name in variables:
            return ".*"  # multi-value and All become regexes
        raise KeyError(name)
    return VARIABLE.sub(repl, expr)


# ---------------------------------------------------------------------------------------------
# The dashboard

def all_panels(dash):
    for p in dash.get("panels", []):
        yield p
        yield from p.get("panels", [])  # a collapsed row holds its panels


def where(panel, target=None):
    w = f'panel {panel.get("id")} "{panel.get("title")}"'
    if target is not None:
        w += f', target {target.get("refId")}'
    return w


def effective_unit(panel, ref_id):
    fc = panel.get("fieldConfig", {})
    unit = fc.get("defaults", {}).get("unit")
    for o in fc.get("overrides", []):
        if o.get("matcher") == {"id": "byFrameRefID", "options": ref_id}:
            for prop in o.get("properties", []):
                if prop.get("id") == "unit":
                    unit = prop.get("value")
    return unit


def check_expr(expr, metrics, variables, multi, label, errors):
    """Checks one expression against the metric table; returns the metrics it uses."""
    fail = lambda msg: errors.append(f"{label}: {msg}\n    expr: {expr}")
    for m in VARIABLE.finditer(expr):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in variables and name not in BUILTIN_VARIABLES:
            fail(f"undefined template variable ${name}")
    try:
        a = analyse(expr)
    except ValueError as e:
        fail(str(e))
        return set()
    used = set()
    for metric, matchers in a["selectors"]:
        if metric is None:
            fail("a selector without a metric name")
            continue
        used.add(metric)
        if metric not in metrics:
            fail(f"metric {metric} is not in docs/metrics.md's Prometheus table")
            continue
        allowed = metrics[metric]["labels"] | SCRAPE_LABELS
        for name, op, value in matchers:
            if name not in allowed:
                fail(f"{metric} has no label {name!r} (docs: {sorted(metrics[metric]['labels'])})")
            refs = {g.group(1) or g.group(2) or g.group(3) for g in VARIABLE.finditer(value)}
            if refs & multi and op not in ("=~", "!~"):
                fail(f"{name}{op}\"{value}\": a multi-value variable needs =~")
        for var in SELECTOR_VARIABLES:
            if not any(n == var and op == "=~" and re.search(rf"\$\{{?{var}\b", v)
                       for n, op, v in matchers):
                fail(f'{metric} does not select on {var}=~"${var}", so runs would be mixed')
    for keyword, labels, scope in a["groupings"]:
        known = scope & metrics.keys()
        allowed = set().union(*(metrics[m]["labels"] for m in known)) | SCRAPE_LABELS
        for name in labels:
            if name not in allowed:
                fail(f"{keyword} ({name}): no metric in its scope {sorted(scope)} has label {name!r}")
    for func, scope in a["functions"]:
        for metric in scope & metrics.keys():
            want = "counter" if func in COUNTER_FUNCTIONS else "gauge"
            if metrics[metric]["type"] != want:
                fail(f"{func}() over {metric}, a {metrics[metric]['type']} (needs a {want})")
    return used


def check_dashboard(dash, metrics, promtool):
    """All problems found, as messages naming the panel, the target and the expression."""
    errors = []
    if dash.get("uid") != "tessera-training" or dash.get("title") != "Tessera training":
        errors.append("dashboard: uid must be tessera-training and title Tessera training")
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        errors.append("dashboard: schemaVersion must be 36 or later")

    # Template variables
    variables = {}
    multi = set()
    for v in dash.get("templating", {}).get("list", []):
        variables[v.get("name")] = v
        if v.get("multi") or v.get("includeAll"):
            multi.add(v.get("name"))
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        errors.append("templating: no variable 'datasource' of type datasource, query prometheus")
    for name in SELECTOR_VARIABLES:
        if name not in variables:
            errors.append(f"templating: no variable {name!r}")
    checked = []  # (label, expr): everything promtool must parse
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        label = f"variable {name}"
        if v.get("datasource") != DATASOURCE:
            errors.append(f"{label}: datasource must be {DATASOURCE}")
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q or "")
        if not m:
            errors.append(f"{label}: query must be label_values(SELECTOR, LABEL), not {q!r}")
            continue
        selector, lab = m.groups()
        try:
            sels = analyse(selector)["selectors"]
        except ValueError as e:
            errors.append(f"{label}: {e}: {q}")
            continue
        for metric, _ in sels:
            if metric not in metrics:
                errors.append(f"{label}: metric {metric} is not in docs/metrics.md: {q}")
            elif lab not in metrics[metric]["labels"] | SCRAPE_LABELS:
                errors.append(f"{label}: {metric} has no label {lab!r}: {q}")
        checked.append((label, selector))

    # Panels
    seen_ids, used, rects = {}, set(), []
    for p in all_panels(dash):
        pid = p.get("id")
        if not isinstance(pid, int) or pid <= 0:
            errors.append(f"{where(p)}: id must be a positive integer")
        elif pid in seen_ids:
            errors.append(f'{where(p)}: id {pid} is also panel "{seen_ids[pid]}"')
        else:
            seen_ids[pid] = p.get("title")
        g = p.get("gridPos")
        if not isinstance(g, dict) or not all(isinstance(g.get(k), int) for k in "hwxy"):
            errors.append(f"{where(p)}: gridPos with integer h, w, x, y is missing")
        elif g["x"] < 0 or g["y"] < 0 or g["w"] <= 0 or g["h"] <= 0 or g["x"] + g["w"] > GRID_WIDTH:
            errors.append(f"{where(p)}: gridPos {g} is off the {GRID_WIDTH}-column grid")
        else:
            for q, r in rects:
                if (g["x"] < r["x"] + r["w"] and r["x"] < g["x"] + g["w"] and
                        g["y"] < r["y"] + r["h"] and r["y"] < g["y"] + g["h"]):
                    errors.append(f"{where(p)}: gridPos overlaps {where(q)}")
            if not (p.get("type") == "row" and p.get("collapsed")):
                rects.append((p, g))
        if p.get("type") == "row":
            if p.get("targets"):
                errors.append(f"{where(p)}: a row has no queries")
            continue
        if p.get("datasource") != DATASOURCE:
            errors.append(f"{where(p)}: datasource must be the variable {DATASOURCE}, "
                          f"not {p.get('datasource')}")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if unit not in KNOWN_UNITS:
            errors.append(f"{where(p)}: unit {unit!r} is not one of {sorted(KNOWN_UNITS)}")
        targets = p.get("targets") or []
        if not targets:
            errors.append(f"{where(p)}: no targets")
        refs = set()
        for t in targets:
            label = where(p, t)
            if not t.get("refId"):
                errors.append(f"{label}: no refId")
            elif t["refId"] in refs:
                errors.append(f"{label}: refId used twice in the panel")
            refs.add(t.get("refId"))
            if "datasource" in t and t["datasource"] != DATASOURCE:
                errors.append(f"{label}: datasource must be the variable {DATASOURCE}")
            expr = t.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                errors.append(f"{label}: no expr")
                continue
            in_expr = check_expr(expr, metrics, variables, multi, label, errors)
            used |= in_expr
            known = in_expr & metrics.keys()
            labels = set().union(*(metrics[m]["labels"] for m in known)) | SCRAPE_LABELS
            for name in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")):
                if name not in labels:
                    errors.append(f"{label}: legend {{{{{name}}}}} is no label of {sorted(known)}"
                                  f"\n    expr: {expr}")
            if len(in_expr) == 1 and not re.search(r"\b(rate|irate|increase)\s*\(", expr):
                (metric,) = in_expr
                got = effective_unit(p, t.get("refId"))
                for suffix, units in SUFFIX_UNITS:
                    if metric.endswith(suffix) and got not in units:
                        errors.append(f"{label}: {metric} is shown in unit {got!r}, "
                                      f"not {' or '.join(sorted(units))}\n    expr: {expr}")
            checked.append((label, expr))

    for metric in sorted(metrics.keys() - used - UNUSED_OK.keys()):
        errors.append(f"{metric}: documented but no panel shows it (or list it in UNUSED_OK)")
    for metric in sorted(UNUSED_OK.keys() - (metrics.keys() - used)):
        errors.append(f"UNUSED_OK: {metric} is used or not documented; drop it from the list")

    errors += promtool_check(checked, variables, promtool)
    return errors


# ---------------------------------------------------------------------------------------------
# promtool

def rules_file(exprs):
    """A rules file with one group and one recording rule per expression (JSON is YAML)."""
    lines = ["groups:"]
    for i, (label, expr) in enumerate(exprs):
        lines += [f"  - name: {json.dumps(f'{i}: {label}')}",
                  "    rules:",
                  f"      - record: tessera_dashboard_check:expr_{i}",
                  f"        expr: {json.dumps(expr)}"]
    return "\n".join(lines) + "\n"


def run_promtool(promtool, exprs):
    with tempfile.NamedTemporaryFile("w", suffix=".rules.yml") as f:
        f.write(rules_file(exprs))
        f.flush()
        r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
    return r.returncode, (r.stdout + r.stderr).strip()


def promtool_check(checked, variables, promtool):
    errors, exprs = [], []
    for label, expr in checked:
        try:
            exprs.append((label, substitute(expr, variables), expr))
        except KeyError:
            pass  # an undefined variable, reported already
    if not exprs:
        return errors
    rc, out = run_promtool(promtool, [(label, sub) for label, sub, _ in exprs])
    if rc == 0:
        if f"SUCCESS: {len(exprs)} rules found" not in out:
            errors.append(f"promtool: expected {len(exprs)} rules, got: {out}")
        return errors
    # One file per expression to name the ones promtool rejects.
    for label, sub, expr in exprs:
        rc1, out1 = run_promtool(promtool, [(label, sub)])
        if rc1 != 0:
            detail = out1.splitlines()[-1].split("could not parse expression: ")[-1]
            errors.append(f"{label}: promtool rejects the expression\n    expr: {expr}\n"
                          f"    as checked: {sub}\n    promtool: {detail}")
    if not errors:
        errors.append(f"promtool check rules failed (rc {rc}):\n{out}")
    return errors


# ---------------------------------------------------------------------------------------------
# Mutations: each must be caught, by the check meant for it (the message contains the fragment)

def panel(dash, title, type_=None):
    return next(p for p in all_panels(dash) if p.get("title") == title
                and (type_ is None or p.get("type") == type_))


def set_expr(dash, title, ref, f, type_="timeseries"):
    t = next(t for t in panel(dash, title, type_)["targets"] if t["refId"] == ref)
    t["expr"] = f(t["expr"])


def mutation_delete(dash, title):
    dash["panels"] = [p for p in dash["panels"] if p.get("title") != title]


MUTATIONS = {
    "a metric name misspelt": (
        lambda d: set_expr(d, "Loss", "A", lambda e: e.replace("tessera_loss", "tessera_losses")),
        "is not in docs/metrics.md"),
    "a matcher on a label the metric lacks": (
        lambda d: set_expr(d, "Loss", "A", lambda e: e.replace("{", '{phase="forward", ', 1)),
        "has no label 'phase'"),
    "by () a label no metric in scope has": (
        lambda d: set_expr(d, "Step time split (mean per step)", "A",
                           lambda e: e.replace("by (job, instance, phase)", "by (job, instance, rank)")),
        "by (rank)"),
    "group_left () a label of no operand": (
        lambda d: set_expr(d, "Runs", "A", lambda e: e.replace("param_dtype)", "dtype)"), "table"),
        "group_left (dtype)"),
    "a PromQL syntax error": (
        lambda d: set_expr(d, "Tokens/s", "B",
                           lambda e: e.replace("[$__rate_interval])", "[$__rate_interval]")),
        "promtool rejects"),
    "a PromQL operator error": (
        lambda d: set_expr(d, "Loss", "B", lambda e: e + " * * 2"),
        "promtool rejects"),
    "rate() over a gauge": (
        lambda d: set_expr(d, "Tokens/s", "B", lambda e: e.replace("tessera_tokens_total", "tessera_step")),
        "rate() over tessera_step"),
    "a selector without the instance filter": (
        lambda d: set_expr(d, "MFU", "A", lambda e: e.replace(', instance=~"$instance"', "")),
        'does not select on instance=~"$instance"'),
    "= with a multi-value variable": (
        lambda d: set_expr(d, "MFU", "A", lambda e: e.replace('job=~"$job"', 'job="$job"')),
        "needs =~"),
    "an undefined template variable": (
        lambda d: set_expr(d, "MFU", "A", lambda e: e.replace("$instance", "$run")),
        "undefined template variable $run"),
    "a legend label the metric lacks": (
        lambda d: panel(d, "Loss", "timeseries")["targets"][0].update(legendFormat="{{rank}}"),
        "legend {{rank}}"),
    "a duplicate panel id": (
        lambda d: panel(d, "MFU", "timeseries").update(id=panel(d, "Loss", "timeseries")["id"]),
        "is also panel"),
    "a panel without gridPos": (
        lambda d: panel(d, "Stragglers").pop("gridPos"),
        "gridPos with integer"),
    "overlapping panels": (
        lambda d: panel(d, "Stragglers")["gridPos"].update(x=0),
        "overlaps"),
    "a hard-coded datasource": (
        lambda d: panel(d, "ETA").update(datasource={"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}),
        "datasource must be the variable"),
    "a target without refId": (
        lambda d: panel(d, "ETA")["targets"][0].pop("refId"),
        "no refId"),
    "a target without expr": (
        lambda d: panel(d, "ETA")["targets"][0].pop("expr"),
        "no expr"),
    "bytes shown as a plain number": (
        lambda d: panel(d, "Resident memory per rank")["fieldConfig"]["defaults"].update(unit="short"),
        "not bytes"),
    "a ratio shown as a plain number": (
        lambda d: panel(d, "MFU", "timeseries")["fieldConfig"]["defaults"].update(unit="short"),
        "not percentunit"),
    "a documented metric on no panel": (
        lambda d: mutation_delete(d, "Stragglers"),
        "tessera_rank_straggler: documented but no panel"),
    "a DCGM family on no panel": (
        lambda d: mutation_delete(d, "GPU temperature"),
        "DCGM_FI_DEV_GPU_TEMP: documented but no panel"),
    "a GPU selected by a label DCGM's families lack": (
        lambda d: set_expr(d, "GPU temperature", "A", lambda e: e.replace("{", '{gpu_index="0", ', 1)),
        "has no label 'gpu_index'"),
    "no datasource variable": (
        lambda d: d["templating"].update(list=[v for v in d["templating"]["list"]
                                               if v["name"] != "datasource"]),
        "no variable 'datasource'"),
    "a variable query on an undocumented label": (
        lambda d: next(v for v in d["templating"]["list"] if v["name"] == "instance")["query"].update(
            query='label_values(tessera_info{job=~"$job"}, host)'),
        "has no label 'host'"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=Path, default=ROOT / "docs" / "metrics.md")
    ap.add_argument("--dashboard", type=Path, default=ROOT / "deploy" / "grafana" / "tessera.json")
    ap.add_argument("--promtool", default="/usr/bin/promtool")
    ap.add_argument("--no-mutations", action="store_true", help="check the dashboard only")
    args = ap.parse_args()

    try:
        r = subprocess.run([args.promtool, "--version"], capture_output=True, text=True)
    except OSError:
        r = None
    if r is None or r.returncode != 0:
        print(f"FAIL: {args.promtool} does not run: install Debian's prometheus (scripts/setup.sh)")
        return 1
    metrics = parse_metrics_doc(args.docs.read_text())
    dash = json.loads(args.dashboard.read_text())

    errors = check_dashboard(dash, metrics, args.promtool)
    n_targets = sum(len(p.get("targets", [])) for p in all_panels(dash))
    print(f"{args.dashboard}: {sum(1 for _ in all_panels(dash))} panels, {n_targets} expressions, "
          f"{len(metrics)} documented metrics")
    if errors:
        for e in errors:
            print(f"FAIL: {e}")
        return 1
    print("dashboard: all checks pass")

    if args.no_mutations:
        return 0
    missed = []
    for name, (mutate, expected) in MUTATIONS.items():
        broken = copy.deepcopy(dash)
        mutate(broken)
        errs = check_dashboard(broken, metrics, args.promtool)
        hit = [e for e in errs if expected in e]
        if not hit:
            missed.append(name)
            print(f"  mutation: {name}: MISSED (wanted {expected!r}; got {errs or 'no error'})")
        else:
            print(f"  mutation: {name}: caught ({hit[0].splitlines()[0]})")
    print(f"mutations: {len(MUTATIONS) - len(missed)}/{len(MUTATIONS)} caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
