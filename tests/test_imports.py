"""imports: the package's import graph, read from the source (every import, at module level or inside a
function): no cycle among schedc's modules, the runtime takes nothing of schedc but the plan format,
schedc.ops, schedc.layout and schedc.descriptions, the compiler never imports torch, click is the command line's alone, and
the passes run only through the driver."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = {"schedc": ROOT / "schedc"}  # the runtime, grammar, library and clusters lie inside
RUNTIME_MAY_IMPORT = ("schedc.plan", "schedc.ops", "schedc.layout", "schedc.descriptions")
# what the driver's passes call: imported by name nowhere but in the driver (the checks share the census)
PASS_FUNCTIONS = ("schedc.checks.structure.check_structure", "schedc.checks.deadlock.check_deadlock",
                  "schedc.checks.memory.check_memory", "schedc.checks.channels.check_channels",
                  "schedc.checks.census.census", "schedc.passes.fill.fill_bubbles", "schedc.passes.lower.lower",
                  "schedc.passes.simulate.simulate", "schedc.passes.simulate.step_sequences")


def _modules() -> dict[str, Path]:
    found = {}
    for package, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def _imported(module: str, path: Path) -> set[str]:
    """The absolute names an import of `module` mentions: `from .x import y` gives both pkg.x and pkg.x.y."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = anchor + ("." + base if base else "")
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (a name resolves to its longest module prefix; a module
    importing its own package's __init__ for a submodule is not an edge)."""
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        targets = {resolve(name) for name in _imported(module, path)} - {None, module}
        graph[module] = {t for t in targets if not module.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_schedc_imports_itself_in_a_circle():
    graph = import_graph()
    assert len(graph) > 40 and "schedc.frontend.parse" in graph["schedc.driver.inputs"]  # the graph is read
    assert cycles(graph) == []


def test_the_runtime_imports_only_the_plan_format_ops_the_layout_and_the_descriptions():
    graph = import_graph()
    assert graph["schedc.runtime.execution.executor"] >= {"schedc.plan", "schedc.ops"}
    leaks = sorted((module, target) for module, targets in graph.items() if module.startswith("schedc.runtime")
                   for target in targets if not target.startswith("schedc.runtime")
                   and not any(target == a or target.startswith(a + ".") for a in RUNTIME_MAY_IMPORT))
    assert leaks == []


def test_the_plan_format_ops_layout_and_descriptions_import_nothing_of_the_compiler():
    graph = import_graph()
    assert graph["schedc.ops"] == set() and graph["schedc.layout"] == set()
    descriptions = {m for m in graph if m == "schedc.descriptions" or m.startswith("schedc.descriptions.")}
    assert len(descriptions) > 1 and all(graph[m] <= descriptions for m in descriptions)
    plan = {"schedc.plan.format", "schedc.plan.validate"}
    assert graph["schedc.plan"] | graph["schedc.plan.format"] | graph["schedc.plan.validate"] <= {"schedc.ops", *plan}


def test_the_compiler_never_imports_torch():
    modules = _modules()
    offenders = sorted(module for module, path in modules.items() if not module.startswith(("schedc.runtime", "schedc.torch"))
                       and any(name == "torch" or name.startswith("torch.") for name in _imported(module, path)))
    assert offenders == []


def test_reading_plans_loads_no_compiler():
    """What the runtime loads of schedc when it imports the plan format: the plan package and ops."""
    import subprocess
    import sys
    from ast import literal_eval
    code = ("import sys, schedc.plan, schedc.runtime\n"
            "print(sorted(m for m in sys.modules if m.startswith(('schedc', 'lark'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert literal_eval(out) == ["schedc", "schedc.ops", "schedc.plan", "schedc.plan.format", "schedc.plan.validate",
                                 "schedc.runtime"]


def test_only_the_command_line_imports_click():
    modules = _modules()
    users = sorted(module for module, path in modules.items()
                   if any(name == "click" or name.startswith("click.") for name in _imported(module, path)))
    assert "schedc.cli.options" in users  # the rule reads real imports
    assert [m for m in users if not m.startswith("schedc.cli")] == []


def test_only_the_driver_runs_the_passes():
    """No module outside schedc.driver imports what a pass calls (a check, the simulator's whole run,
    the fill, the lowering): a tool that needs a compile goes through the driver, so a pass added to
    PASSES is never missing from it."""
    modules = _modules()
    importers = {module: sorted(set(_imported(module, path)) & set(PASS_FUNCTIONS)) for module, path in modules.items()}
    assert "schedc.checks.structure.check_structure" in importers["schedc.driver.passes"]
    offenders = {m: names for m, names in importers.items() if names and not m.startswith("schedc.driver")
                 and not (m.startswith("schedc.checks.") and names == ["schedc.checks.census.census"])}
    assert offenders == {}


def test_modules_and_functions_stay_small():
    """Each module one responsibility (at most 500 lines), each function one step (at most 60 lines)."""
    long_modules, long_functions = [], []
    for module, path in _modules().items():
        text = path.read_text()
        if text.count("\n") > 500:
            long_modules.append(module)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{module}.{node.name}")
    assert long_modules == [] and long_functions == []
