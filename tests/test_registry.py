"""The field registry is the one place fields are declared, and the code
is split without import cycles (issue 33's invariants)."""

import ast
import os
import re

import pytest

from calculon.config import registry
from calculon.config.application import OPTIONAL as APP_OPTIONAL
from calculon.config.execution import FIELD_SPECS, OPTIONAL_SPECS
from conftest import ROOT

#: Where a behaviour field's name may appear in the code and data of the
#: project (tests and docs, which use and explain them, are not scanned):
#: the registry, its physics term, the preset files -- and, named here with
#: why, the places that must know one of them in particular.
PHYSICS = ('calculon/llm/terms/', 'calculon/llm/layers.py',
           'calculon/llm/block.py')
EXCEPTIONS = {
  # A run's notes may state the split (Megatron-Core's
  # --account-for-embedding-in-pipeline-split): a row fact, and the
  # mapping must know the block slots per stage to list the VP degrees.
  'pipeline_split_counts_vocab': ('validation/conventions.yaml',
                                  'calculon/validation/mapping.py'),
  # A run's notes may state the Muon optimizer, with which
  # Megatron-Bridge gathers 16-bit parameters: a row fact.
  'narrow_param_gather': ('validation/conventions.yaml',),
  # A torchtitan run's notes may state --training.compile, with which
  # torchtitan since bbb1b616e compiles its loss too: a row fact, known
  # with the commit the source names.
  'cross_entropy_kernel': ('validation/conventions.yaml',),
  # A run's notes may state an all-gather based CP (Llama 3, arXiv
  # 2407.21783 section 3.3.2): a row fact.
  'context_par_comm': ('validation/conventions.yaml',),
  # The preset's value is fitted to its framework's A/B runs: the fit
  # script sets the field on the runs it prices.
  'tensor_par_overlap_efficiency': (
    'validation/fit_overlap_efficiency.py',),
}
SCANNED = ('calculon', 'validation', 'systems', 'frameworks')


def _files():
  for top in SCANNED:
    for folder, _, names in os.walk(os.path.join(ROOT, top)):
      for name in names:
        if name.endswith(('.py', '.json', '.yaml')):
          path = os.path.join(folder, name)
          yield os.path.relpath(path, ROOT), open(path, encoding='utf-8').read()


def _allowed(name, path):
  return (path == 'calculon/config/registry.py' or
          path.startswith('frameworks/') or path.startswith(PHYSICS) or
          # an exporter writes a resolved behaviour as the framework's
          # own flag (ddp.overlap_param_gather, ...)
          path.startswith('calculon/export/') or
          path in EXCEPTIONS.get(name, ()))


def test_behaviour_fields_live_in_the_registry_physics_and_presets():
  """A behaviour's name appears only in the registry, its physics term and
  the preset files (and the listed exceptions): adding one is a registry
  entry, a term and preset values."""
  files = list(_files())
  behaviours = registry.behaviours()
  assert len(behaviours) >= 14
  for name in behaviours:
    pattern = re.compile(rf'\b{name}\b')
    where = sorted(p for p, text in files if pattern.search(text))
    stray = [p for p in where if not _allowed(name, p)]
    assert not stray, (name, stray)
    assert any(p.startswith(PHYSICS) for p in where), (name, 'no physics')
    assert 'calculon/config/registry.py' in where


def test_the_registry_declares_every_field_once():
  """Validation reads its specs from the registry: Calculon's 23 execution
  fields, the optional ones, the application's; each field has a group,
  a one-line doc and (optional fields) what its absence means."""
  ex = registry.FIELDS['execution']
  assert list(FIELD_SPECS) == [n for n, f in ex.items() if f.calculon]
  assert len(FIELD_SPECS) == 23
  assert list(OPTIONAL_SPECS) == [n for n, f in ex.items()
                                  if not f.calculon and n != 'framework']
  app = registry.FIELDS['application']
  assert list(APP_OPTIONAL) == [n for n, f in app.items() if not f.calculon]
  for kind, fields in registry.FIELDS.items():
    for f in fields.values():
      assert f.group in registry.GROUPS[kind], f
      assert f.doc, f
      assert f.required or f.absent_doc, f
  # Every spec object of the validation is the registry's own.
  for name, (spec, _) in FIELD_SPECS.items():
    assert spec is ex[name].spec


def test_reference_pages_match_the_registry():
  """docs/reference/{applications,executions,systems,frameworks}.md are
  what ``python -m calculon.docs`` writes from the registry and the
  presets."""
  from calculon import docs
  for name, text in docs.pages().items():
    path = os.path.join(ROOT, 'docs', 'reference', name)
    assert open(path, encoding='utf-8').read() == text, (
      f'{name} is out of date: run python -m calculon.docs')


def _module_imports(path, module, modules):
  """Modules of calculon that ``path`` imports, at its top level or inside
  its functions (``from P import m`` of a submodule m counts as m)."""
  tree = ast.parse(open(path, encoding='utf-8').read())
  out = set()
  package = module if path.endswith('__init__.py') else \
    module.rpartition('.')[0]
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = package.split('.')
        base = '.'.join(parts[:len(parts) - node.level + 1] +
                        ([base] if base else []))
      subs = [f'{base}.{a.name}' for a in node.names]
      names = [m for m in subs if m in modules] or [base]
    for name in names:
      if name.startswith('calculon'):
        out.add(name)
  return out


def test_no_import_cycle_inside_calculon():
  """The imports inside calculon/, at module level or inside functions,
  form no cycle (the search's grid, exhaustive, bound and driver import
  only those before them; the engine's concern modules only their base)."""
  modules = {}
  for folder, _, names in os.walk(os.path.join(ROOT, 'calculon')):
    for name in names:
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
        module = rel[:-len('.__init__')] if rel.endswith('__init__') else rel
        modules[module] = path
  graph = {}
  for module, path in modules.items():
    deps = set()
    for name in _module_imports(path, module, modules):
      while name and name not in modules:
        name = name.rpartition('.')[0]
      if name and name != module:
        deps.add(name)
    graph[module] = deps
  state, stack = {}, []

  def visit(node):
    state[node] = 'open'
    stack.append(node)
    for dep in sorted(graph[node]):
      if state.get(dep) == 'open':
        cycle = stack[stack.index(dep):] + [dep]
        pytest.fail('import cycle: ' + ' -> '.join(cycle))
      elif dep not in state:
        visit(dep)
    stack.pop()
    state[node] = 'done'
  for node in sorted(graph):
    if node not in state:
      visit(node)
  search = {m: graph[m] for m in graph if m.startswith('calculon.search.')}
  assert not (search['calculon.search.grid'] & {
    'calculon.search.exhaustive', 'calculon.search.bound',
    'calculon.search.driver'})
  assert 'calculon.search.driver' not in search['calculon.search.bound']
