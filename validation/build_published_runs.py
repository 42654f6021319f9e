"""Builds validation/published_runs.csv from ../shared/measurements/
published_runs.csv.

Every column of the shared file is copied verbatim (the facts, each row's
source and its provenance notes).  Six columns are added, each value
written from what the row's source states (see its ``notes``) or, where it
states nothing, a documented assumption:

* ``id`` -- a stable short name: a prefix for the source and a number.
* ``source_short`` -- the source in a few words (plot legends).
* ``mlp`` -- ``plain`` (two GEMMs, GeLU or squared ReLU) or ``gated``
  (SwiGLU: three GEMMs; LLaMA, Touvron et al. 2023, and NeMo's LlamaConfig
  ``gated_linear_unit=True``; PaLM, Chowdhery et al. 2022 section 2).
* ``block_layout`` -- ``sequential`` (attention then MLP) or ``parallel``
  (attention and MLP from the same input: GPT-NeoX ``gpt_j_residual``,
  PaLM "parallel layers").
* ``assumptions`` -- ``key=value`` settings separated by ``;`` that fill
  blank columns or fix options no column holds (keys: see
  ``calculon.validation.published.ASSUMPTION_KEYS``).
* ``assumptions_why`` -- the reason of each assumption.
* ``unsupported`` -- features of the run, named by its source, that the
  model does not have (``;``-separated), beyond those the columns show.

Run from the repository root: ``python validation/build_published_runs.py
[SHARED_CSV]``.
"""

import csv
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(ROOT, '..', 'shared', 'measurements',
                      'published_runs.csv')
OUT = os.path.join(ROOT, 'validation', 'published_runs.csv')
ADDED = ('id', 'source_short', 'mlp', 'block_layout', 'assumptions',
         'assumptions_why', 'unsupported')

# Megatron-LM of 2021-2022 and Megatron-DeepSpeed: no tiled overlap of TP
# communication with GEMMs (it arrived with Transformer Engine userbuffers).
NO_TP_OVERLAP = ('tensor_par_overlap=none',
                 'Megatron-LM (2021-2022) and Megatron-DeepSpeed do not '
                 'overlap TP communication with GEMMs')


def _num(text):
  return float(text) if text.strip() else None


def _rules(row):
  """(prefix, short source, assumptions [(setting, why)], unsupported,
  mlp, block_layout) of a row, from its source."""
  src = row['source']
  tp, pp = _num(row['tp']), _num(row['pp'])
  a, unsupported = [], []
  mlp, layout = 'plain', 'sequential'
  if src.startswith('Narayanan'):
    prefix, short = 'ptdp21', 'Narayanan 2021 (Megatron-LM)'
    if tp and tp > 1 and pp and pp > 1:
      a.append(('tensor_par_comm_type=p2p_rs_ag',
                "the runs use the scatter/gather optimization (notes: "
                "'scatter/gather (section 5.1)'): pipeline sends split over "
                'TP, which is p2p_rs_ag'))
    a.append(('optimizer_sharding=false',
              'PTD-P keeps the optimizer state replicated (the paper '
              'compares against ZeRO-3 instead of using it)'))
    a.append(NO_TP_OVERLAP)
  elif src.startswith('Korthikanti'):
    prefix, short = 'seqsel22', 'Korthikanti 2022 (Megatron-LM)'
    if not row['vp'].strip() and pp and pp > 1:
      a.append(('vp=1', 'the paper interleaves (m = 3) only the 175B and '
                '530B runs (notes)'))
    a.append(('optimizer_sharding=false', 'no distributed optimizer in the '
              'paper; the Table 3 runs have no data parallelism'))
    a.append(('data_par_overlap=false', "section 6.3: no overlap of the "
              'gradient all-reduce with back-propagation'))
    a.append(NO_TP_OVERLAP)
  elif src.startswith('NVIDIA/NeMo'):
    prefix, short = 'nemo2407', 'NeMo 24.07 (H100, FP8)'
    if not row['vp'].strip():
      a.append(('vp=1', "notes: 'VP=1 in table written as blank'"))
    if row['model_name'].startswith('LLAMA'):
      mlp = 'gated'
  elif src.startswith('bigscience'):
    prefix, short = 'bloom', 'BLOOM (Megatron-DeepSpeed)'
    if not row['vp'].strip():
      a.append(('vp=1', "DeepSpeed's pipeline engine (Megatron-DeepSpeed) "
                'has no interleaved schedule'))
    a.append(('optimizer_sharding=true', "notes: 'ZeRO-1'"))
    a.append(NO_TP_OVERLAP)
  elif src.startswith('Zhang'):
    prefix, short = 'opt', 'OPT (Zhang 2022)'
    unsupported.append('fully sharded data parallelism (FSDP: parameters, '
                       'gradients and optimizer state sharded over DP)')
  elif src.startswith('Black'):
    prefix, short = 'neox', 'GPT-NeoX (Black 2022)'
    layout = 'parallel'
  elif src.startswith('Chowdhery'):
    prefix, short = 'palm', 'PaLM (Chowdhery 2022)'
    mlp, layout = 'gated', 'parallel'
    unsupported.append('fully sharded data parallelism (256-way)')
  elif src.startswith('Rae'):
    prefix, short = 'gopher', 'Gopher (Rae 2021)'
  else:
    raise SystemExit(f'no rule for source {src!r}: add one to {__file__}')
  return prefix, short, a, unsupported, mlp, layout


def build(shared=SHARED, out=OUT):
  """Writes ``out`` from ``shared``; returns the number of rows."""
  with open(shared, newline='') as fd:
    reader = csv.DictReader(fd)
    columns = list(reader.fieldnames)
    rows = list(reader)
  counts = {}
  for row in rows:
    prefix, short, a, unsupported, mlp, layout = _rules(row)
    counts[prefix] = counts.get(prefix, 0) + 1
    row['id'] = f'{prefix}-{counts[prefix]:02d}'
    row['source_short'] = short
    row['mlp'] = mlp
    row['block_layout'] = layout
    row['assumptions'] = '; '.join(s for s, _ in a)
    row['assumptions_why'] = '; '.join(f'{s.split("=")[0]}: {w}'
                                       for s, w in a)
    row['unsupported'] = '; '.join(unsupported)
  with open(out, 'w', newline='') as fd:
    writer = csv.DictWriter(fd, fieldnames=['id'] + columns + list(ADDED[1:]),
                            lineterminator='\n')
    writer.writeheader()
    writer.writerows(rows)
  return len(rows)


if __name__ == '__main__':
  n = build(sys.argv[1] if len(sys.argv) > 1 else SHARED)
  print(f'{os.path.relpath(OUT, ROOT)}: {n} rows')
