"""Presets in words: what each sets, allows and requires.

Provides :func:`summary_rows` (one row per preset), :func:`describe` (the
text ``calculon frameworks NAME`` prints) and :func:`as_json` (a preset as
plain data).  Reads the presets (:mod:`calculon.frameworks.preset`) and
the field registry.  Used by ``calculon frameworks`` and by the reference
page docs/reference/frameworks.md.
"""

from calculon.config import registry


def _value(v):
  if isinstance(v, bool):
    return 'true' if v else 'false'
  if isinstance(v, str) and ',' in v:
    return '[' + ', '.join(v.split(',')) + ']'
  return str(v)


def _when(when):
  parts = []
  for key, cond in when.items():
    if key == 'vocab_split_only_even':
      parts.append('PP x VP divides the blocks + 2 and not the blocks'
                   if cond else 'the blocks split evenly')
    elif key == 'experts':
      parts.append('with experts' if cond else 'without experts')
    elif isinstance(cond, dict):
      lo, hi = cond.get('min'), cond.get('max')
      parts.append(f'{key} >= {lo}' if hi is None else
                   f'{key} <= {hi}' if lo is None else
                   f'{lo} <= {key} <= {hi}')
    else:
      parts.append(f"{key} {'/'.join(_value(v) for v in cond)}")
  return ' and '.join(parts)


def case_text(case):
  """One case of a rule in words."""
  if case.values is not None:
    text = 'one of ' + ', '.join(_value(v) for v in case.values)
    if case.value is not None:
      text += f' (default {_value(case.value)})'
  else:
    text = _value(case.value)
  if case.when:
    text += f' when {_when(case.when)}'
  return text


def rule_text(rule):
  """A rule in words (its cases, then 'else absent')."""
  text = '; '.join(case_text(c) for c in rule.cases)
  if all(c.when for c in rule.cases):
    absent = registry.field('execution', rule.field).absent
    text += f'; else {_value(absent)} (absent)'
  return text


def summary_rows(presets):
  """[(name, era, title)] of ``presets``."""
  return [(p.name, p.era, p.title) for p in presets]


def offload_text(preset):
  """The offload kinds a preset allows, in words."""
  if preset.offload_kinds is None:
    return 'any combination of weights, activations and optimizer state'
  kinds = [' + '.join(sorted(k)) for k in preset.offload_kinds if k]
  if not kinds:
    return 'none'
  text = ', '.join(kinds)
  if preset.optimizer_step:
    text += f' (with the optimizer state offloaded, its step runs on the ' \
            f'{preset.optimizer_step})'
  return text


def describe(preset, sources=True):
  """Lines describing one preset."""
  lines = [f'{preset.name}: {preset.title}', f'  era: {preset.era}']
  if preset.source:
    lines.append(f'  source: {preset.source}')
  if preset.notes:
    lines.append(f'  {preset.notes}')
  if preset.space == 'calculon':
    lines.append("  search space: Calculon's (llm-optimal-execution as "
                 'Calculon searches)')
  if not preset.strict:
    lines.append('  accepts any value of every field a user writes')
  for title, rules in (('sets (behaviours)', preset.behaviours),
                       ('sets or allows (options; the search tries the '
                        'values allowed)', preset.options)):
    if not rules:
      continue
    lines.append(f'  {title}:')
    for name, rule in rules.items():
      lines.append(f'    {name}: {rule_text(rule)}')
      srcs = [rule.source] + [c.source for c in rule.cases]
      # A field without cases is its own single case: one source, once.
      src = '; '.join(dict.fromkeys(s for s in srcs if s))
      if sources and src:
        lines.append(f'      source: {src}')
  lines.append(f'  offload: {offload_text(preset)}')
  if sources and preset.offload_source:
    lines.append(f'      source: {preset.offload_source}')
  for con in preset.constraints:
    lines.append(f'  requires: {con.text}')
    if sources and con.source:
      lines.append(f'      source: {con.source}')
  for key, value in preset.run.items():
    if key != 'source':
      lines.append(f'  run: {key} {_value(value)}')
  if sources and preset.run.get('source'):
    lines.append(f"      source: {preset.run['source']}")
  return lines


def as_json(preset):
  """A preset as plain data (what ``calculon frameworks --json`` writes)."""
  import json
  with open(preset.path, encoding='utf-8') as f:
    return json.load(f)
