"""Whole pretraining runs: predicted vs published GPU-hours, days, energy.

Input: a CSV in the columns of ``../shared/measurements/whole_runs.csv``
(:data:`COLUMNS`; the bundled copy is ``validation/whole_runs.csv``): a
model's shape, the tokens it was trained on, the GPUs, and what was
published of its GPU-hours, wall-clock days and energy.  For every row this
module

1. maps it onto the model by the published suite's conventions
   (``validation/conventions.yaml`` through
   :class:`calculon.validation.mapping.Mapper`: the model family, the
   hardware table, the datatype, the rules of its source);
2. takes the tokens, the GPU type, the GPU count and the global batch
   from the row, or else from :data:`RUN_FACTS` (each with its source),
   the scale the row's texts state, or the documented defaults
   (:data:`DEFAULT_GPU_TYPE`, :data:`DEFAULT_GPUS`,
   :data:`DEFAULT_BATCH_TOKENS`), and says so in the row's assumptions;
3. prices the parallel layout the row states (its unknown settings
   searched as the published suite does: the fastest feasible candidate)
   or, when the row states none, searches every layout for the fastest
   step of exactly that batch (:func:`calculon.plan.objective.rank`), and
   says so;
4. prices the whole run (:func:`calculon.plan.run.price_runs`) with the
   system's reliability, storage and power sections or their documented
   defaults, nothing fitted to these rows;
5. reports error = 100 x (predicted / published - 1) percent (positive:
   the model predicts more) for the GPU-hours, the days and the energy.
   A row with no published GPU-hours, days or energy is priced all the
   same, status ``'predicted'``: its predicted figures are reported with
   no error and stay out of every median.

The published energy is compared with the GPUs' predicted energy times the
PUE (what the papers and model cards count: GPU power x hours x PUE); the
total with the nodes' other parts is reported beside it.
"""

from dataclasses import dataclass, field
import json
import math
import os
import re

import numpy as np

from calculon.errors import ConfigError

#: Columns of the whole-runs file, in its order.
COLUMNS = (
  'id', 'model', 'source', 'params_total', 'params_active', 'num_layers',
  'hidden', 'ffn_hidden', 'attn_heads', 'kv_heads', 'vocab', 'seq_len',
  'tokens_trained', 'gpu_type', 'num_gpus', 'wall_days', 'gpu_hours',
  'power_w_per_gpu_assumed', 'energy_mwh', 'interruptions',
  'effective_training_time_pct', 'parallelism', 'mfu_or_tflops', 'notes')
#: Columns a file must have.
REQUIRED = ('model', 'source', 'seq_len', 'tokens_trained', 'gpu_type')
#: Optional columns a user's file may add: ``global_batch_size`` (sequences),
#: ``tp``, ``pp``, ``dp``, ``cp`` (the layout), ``dtype``, ``trained_from``
#: (YYYY-MM, the month training began).
OPTIONAL = ('global_batch_size', 'tp', 'pp', 'dp', 'cp', 'dtype',
            'trained_from')
#: The metrics compared.
METRICS = ('gpu_hours', 'wall_days', 'energy_mwh')

#: Facts of whole runs their rows leave out: model name pattern -> the
#: global batch in sequences (``batch``), the GPU count (``gpus``), the GPU
#: type (``gpu_type``), the tokens trained (``tokens``), what the training
#: code did (``parallelism``, ``recompute``) and the month training began
#: (``trained_from``, YYYY-MM: the conventions' era rules read it), each
#: with its source (``why_<key>``); a row's own cell always wins.
RUN_FACTS = (
  (r'^llama-(7|13|33|65)b$',
   {'batch': 2048, 'why_batch': 'LLaMA (arXiv 2302.13971) Table 2: batch '
    '4M tokens for every size = 2,048 sequences of 2,048',
    'gpus': 2048, 'why_gpus': 'LLaMA section 2.4 states 2,048 A100-80GB for '
    'the 65B only: assumed for every size',
    'parallelism': 'model and sequence parallelism',
    'why_parallelism': 'LLaMA (arXiv 2302.13971) section 2.4, on the '
    'training code of its models: "we use model and sequence parallelism '
    'as described by Korthikanti et al. (2022)" (no degrees, no pipeline)',
    'recompute': 'selective',
    'why_recompute': 'LLaMA (arXiv 2302.13971) section 2.4: "we reduce the '
    'amount of activations that are recomputed during the backward pass '
    'with checkpointing. More precisely, we save the activations that are '
    'expensive to compute, such as the outputs of linear layers": the '
    'cheap activations recomputed, as selective recomputation does'}),
  (r'^llama 2 ',
   {'batch': 1024, 'why_batch': 'Llama 2 (arXiv 2307.09288) section 2.2: '
    'global batch 4M tokens = 1,024 sequences of 4,096',
    'gpus': 2048, 'why_gpus': 'the Llama 2 paper states no GPU count: the '
    "LLaMA 65B run's 2,048 A100s assumed",
    'trained_from': '2023-01', 'why_trained_from': 'the Llama 2 model card '
    '(meta-llama/llama-models models/llama2/MODEL_CARD.md@d13eea5ec039baa48b'
    '5f0fa3641692a45b639da7, "Model Dates"): "Llama 2 was trained between '
    'January 2023 and July 2023"'}),
  (r'^llama 3\.1 405b$',
   {'batch': 2048, 'why_batch': 'arXiv 2407.21783 Table 4: 16 sequences of '
    '8,192 per data-parallel rank x 128 ranks (16,384 GPUs) = 2,048'}),
  (r'^opt-175b$',
   {'batch': 992, 'why_batch': 'OPT (arXiv 2205.01068) Table 1: batch 2M '
    'tokens; on 992 GPUs with TP 8, 124 data-parallel ranks x 8 = 992 '
    'sequences of 2,048 (2.03M tokens)'}),
  (r'^nemotron-4 15b$',
   {'batch': 1152, 'why_batch': 'arXiv 2402.16819 Table 2: the 2,304-GPU '
    'stage (7.6T of the 8T tokens) runs batch 1,152; priced for every '
    'token'}),
  (r'^olmo 7b\b(?!.*twin)',
   {'gpu_type': 'A100-40GB', 'why_gpu_type': 'OLMo (arXiv 2402.00838) '
    'section 3 trains on two clusters, LUMI (AMD MI250X: no system file) '
    'and MosaicML (27 nodes x 8 A100-40GB); the OLMo 7B card '
    '(allenai/OLMo-7B README) has its Twin 2T "on different hardware": '
    'the A100-40GB cluster assumed for this run',
    'gpus': 216, 'why_gpus': 'the MosaicML cluster of arXiv 2402.00838 '
    'section 3: 27 nodes x 8 A100-40GB = 216 (assumed, as the GPU type)',
    'batch': 2160, 'why_batch': 'the OLMo 7B card\'s final checkpoint '
    'step556000-tokens2460B: 2.46T / 556,000 steps / 2,048 = 2,160 '
    'sequences (arXiv 2402.00838 Table 1: ~4M tokens; 10 per GPU on 216)'}),
  (r'^bloom-176b$',
   {'tokens': 366e9, 'why_tokens': 'BLOOM (arXiv 2211.05100) Table 3 '
    '(p. 21): 366B tokens in total (the row leaves it blank: its README '
    'log shows 325B at the end of epoch 1)'}),
  (r'^gpt-neox-20b$',
   {'batch': 1536, 'why_batch': 'EleutherAI/gpt-neox configs/20B.yml@'
    '252ddc522fba7e2138d4c08fd05f6d11084567b8 (the run as trained on 96 '
    'A100-40GB): micro-batch 4 x 32 accumulation steps x 12 data-parallel '
    'ranks (96 / (TP 2 x PP 4)) = 1,536 sequences of 2,048'}),
  (r'^deepseek-v2\b',
   {'batch': 9216, 'why_batch': 'DeepSeek-V2 (arXiv 2405.04434) section '
    '3.1.2: the batch ramps from 2,304 to 9,216 over the first 225B tokens '
    'and keeps 9,216 (priced for every token)'}),
)

#: The GPU type where a row and its run facts state none: the A100 80 GB,
#: the GPU most runs of the bundled whole-runs file state (LLaMA, Llama 2,
#: OPT, BLOOM), flagged as assumed.
DEFAULT_GPU_TYPE = 'A100-80GB'
#: The GPU count where a row, its texts and its run facts state none:
#: 2,048, the scale of LLaMA 65B (arXiv 2302.13971 section 2.4: 2,048
#: A100-80GB) and of DeepSeek-V3 (arXiv 2412.19437 section 3.1: 2,048
#: H800), flagged as assumed.
DEFAULT_GPUS = 2048


def default_path(base_dir):
  """The bundled whole-runs file."""
  return os.path.join(base_dir, 'validation', 'whole_runs.csv')


def read_runs(path):
  """The rows of a whole-runs CSV as a DataFrame of strings (blanks '');
  rows without an id get ``run-NN``.

  Raises:
    ConfigError: a missing or unreadable file, a required column missing,
      a duplicate id.
  """
  from calculon.io import read_runs_csv
  frame = read_runs_csv(path, REQUIRED, COLUMNS + OPTIONAL,
                        'a whole-runs file')
  ids = []
  for i, given in enumerate(frame['id']):
    ids.append(given.strip() or f'run-{i + 1:02d}')
  frame['id'] = ids
  dup = frame['id'][frame['id'].duplicated()]
  if len(dup):
    raise ConfigError(f"{path}: field 'id' = {dup.iloc[0]!r} is not allowed: "
                      'ids must be unique', source=path, field='id',
                      value=dup.iloc[0])
  return frame


def _number(cell):
  """A cell as a float (None when blank or not a positive finite number)."""
  text = str(cell or '').strip().replace(',', '')
  if not text:
    return None
  try:
    value = float(text)
  except ValueError:
    return None
  return value if math.isfinite(value) and value > 0 else None


def _count(cell):
  value = _number(cell)
  return int(round(value)) if value is not None and value == int(value) \
    else None


def parse_layout(text, gpus):
  """(tp, pp, dp, cp) a parallelism text states for ``gpus`` GPUs (None
  where not stated): the ';'-separated part naming that GPU count, else
  the first part naming a TP degree ('no TP' states TP 1)."""
  text = str(text or '')
  parts = [p for p in re.split(r';', text) if p.strip()]
  chosen = None
  if gpus:
    names = {f'{gpus:,}', str(gpus)}
    for part in parts:
      if any(re.search(rf'(?<![\d,]){re.escape(n)}(?![\d,])', part)
             for n in names) and re.search(r'\bTP', part):
        chosen = part
        break
  if chosen is None:
    chosen = next((p for p in parts if re.search(
      r'\bTP\s*\d|\d+x TP|\bno\s+TP\b', p, re.IGNORECASE)), '')

  def first(patterns):
    for pat in patterns:
      m = re.search(pat, chosen, re.IGNORECASE)
      if m:
        return int(next(g for g in m.groups() if g))
    return None
  tp = first([r'\bTP\s*=?\s*(\d+)', r'(\d+)x\s*TP', r'(\d+)-way\s+TP'])
  if tp is None and re.search(r'\bno\s+TP\b', chosen, re.IGNORECASE):
    tp = 1
  pp = first([r'\bPP\s*=?\s*(\d+)', r'(\d+)-way\s+(?:zero-bubble\s+)?PP'])
  dp = first([r'\bDP\s*=?\s*(\d+)'])
  cp = first([r'\bCP\s*=?\s*(\d+)'])
  return tp, pp, dp, cp


#: A parallelism text naming tensor (model) parallelism without a degree:
#: 'model parallelism', 'tensor parallelism', 'sequence parallelism' (which
#: splits the sequence over the TP ranks: Korthikanti et al. 2022, arXiv
#: 2205.05198, section 4.2.2) -- not 'pipeline model parallelism'.
_NAMES_TP = re.compile(r'(?<!pipeline )\bmodel[ -]parallel|\btensor[ -]'
                       r'parallel|\bsequence[ -]parallel|\bTP\b',
                       re.IGNORECASE)
_NAMES_SP = re.compile(r'\bsequence[ -]parallel', re.IGNORECASE)
_NAMES_PP = re.compile(r'\bpipeline|\bPP\b', re.IGNORECASE)
#: A parallelism text naming a data-parallel sharding -> the sharding
#: (first match wins): FSDP, ZeRO-3 or a fully sharded data parallelism
#: shards the parameters (Zhao et al., "PyTorch FSDP", arXiv 2304.11277,
#: section 3; ZeRO, Rajbhandari et al., arXiv 1910.02054, section 5: P_os+g+p),
#: ZeRO-2 the gradients too, ZeRO-1 or a distributed optimizer the
#: optimizer state.
_NAMES_SHARDING = (
  (re.compile(r'\bFSDP\b(?!\s*=\s*0)|fully[ -]sharded|sharded data[ -]'
              r'parallel|ZeRO[ -]?(?:stage[ -]?)?3', re.IGNORECASE),
   'parameters'),
  (re.compile(r'ZeRO[ -]?(?:stage[ -]?)?2', re.IGNORECASE), 'gradients'),
  (re.compile(r'ZeRO[ -]?(?:stage[ -]?)?1|distributed optimizer',
              re.IGNORECASE), 'optimizer'))
_NAMES_RECOMPUTE = re.compile(r'checkpointing|recomput|rematerial',
                              re.IGNORECASE)


def stated_techniques(text):
  """What a parallelism text states without degrees, for a searched
  layout: {'tp': names tensor (model) parallelism, so TP >= 2; 'sp':
  names sequence parallelism (the TP communication reduce-scattered and
  all-gathered, rs_ag); 'pp': names pipeline parallelism (when it does not,
  PP = 1, as for a stated TP degree); 'sharding': the data-parallel
  sharding it names ('parameters' for FSDP or ZeRO-3, 'gradients',
  'optimizer'; :data:`_NAMES_SHARDING`), or ''; 'recompute': the phrase
  naming activation checkpointing (read by the conventions' recompute
  table), or ''}."""
  text = str(text or '')
  m = _NAMES_RECOMPUTE.search(text)
  sharding = next((name for pattern, name in _NAMES_SHARDING
                   if pattern.search(text)), '')
  return {'tp': bool(_NAMES_TP.search(text)),
          'sp': bool(_NAMES_SP.search(text)),
          'pp': bool(_NAMES_PP.search(text)),
          'sharding': sharding,
          'recompute': text[m.start():].split(';')[0].strip() if m else ''}


def expert_par_from_text(text):
  """The expert-parallel degree a parallelism text states ('8-way EP',
  'EP8', 'EP = 8', '8x EP'), or None."""
  text = str(text or '')
  for pat in (r'(\d+)-way\s+(?:expert\s+parallel(?:ism)?|EP)\b',
              r'\bEP\s*=?\s*(\d+)', r'(\d+)x\s*EP\b'):
    m = re.search(pat, text, re.IGNORECASE)
    if m:
      return int(m.group(1))
  return None


def _batch_from_text(text, seq):
  """A global batch a text states as 'B x S' sequences of S tokens."""
  for m in re.finditer(r'(\d[\d,]*)\s*x\s*(\d[\d,]*)', str(text or '')):
    b, s = (int(x.replace(',', '')) for x in m.groups())
    if s == seq:
      return b
  return None


#: Tokens per global batch where a row states neither the batch nor a model
#: the name points to: 4 Mi tokens (2**22), the pretraining batch of Llama 2
#: (Touvron et al. 2023, arXiv 2307.09288, section 2.2: 4M tokens), Llama 3
#: 405B's first stage (arXiv 2407.21783, section 3.4.1: 4M tokens) and OLMo
#: 2 7B (arXiv 2501.00656: 1,024 x 4,096); the batch is
#: that over the sequence length (flagged as assumed).
DEFAULT_BATCH_TOKENS = 1 << 22


def _gpus_from_text(text):
  """The GPU count a text states as 'N nodes x G' (N x G) or 'N,NNN <GPU>'
  / 'N <GPU>' (a number before an NVIDIA GPU name), or None: the source's
  stated scale where the row's GPU count is empty."""
  text = str(text or '')
  m = re.search(r'(\d[\d,]*)\s*nodes?\s*(?:x|\u00d7)\s*(\d+)', text)
  if m:
    return int(m.group(1).replace(',', '')) * int(m.group(2))
  m = re.search(r'(?<![\d.])(\d{1,3}(?:,\d{3})+|\d+)\s*(?:x\s*)?'
                r'(?:NVIDIA\s+)?(?:A100|H100|H200|H800|B200|B300|GB200|GB300)',
                text)
  if m:
    return int(m.group(1).replace(',', ''))
  return None


#: Model FLOP over hardware FLOP with full activation recompute: the
#: forward pass runs twice, 8 FLOP per parameter per token instead of 6
#: (Korthikanti et al. 2022, arXiv 2205.05198, section 6: hardware FLOPs
#: utilization counts the recomputed forward, model FLOPs utilization does
#: not; Megatron-DeepSpeed's TFLOP/s log uses the 4 x 2 coefficient).
HFU_TO_MFU_FULL_RECOMPUTE = 6.0 / 8.0


def published_rate(row, gpus, flops_per_token, peak_flops):
  """The step rate a row's ``mfu_or_tflops`` text states for ``gpus``
  GPUs, as tokens per second per GPU: a tokens/s/GPU figure as it is, an
  MFU percentage x the peak / the model FLOP per token, a TFLOP/s figure /
  the model FLOP per token (whole-attention convention: the source's may
  differ; a part that calls its TFLOP/s hardware FLOP with activation
  recompute is scaled by :data:`HFU_TO_MFU_FULL_RECOMPUTE`).  The ','- or
  ';'-separated part naming the GPU count wins, else the first figure.
  Returns (value, what) or (None, '')."""
  text = str(row.get('mfu_or_tflops') or '')
  if not text.strip():
    return None, ''
  parts = [p for p in re.split(r'[;,](?!\d{3})', text) if p.strip()]
  names = {f'{gpus:,}', str(gpus)} if gpus else set()
  ordered = [p for p in parts if any(
    re.search(rf'(?<![\d,]){re.escape(n)}(?![\d,])', p) for n in names)]
  ordered += [p for p in parts if p not in ordered]
  for part in ordered:
    m = re.search(r'(\d+(?:\.\d+)?)\s*tokens?\s*/\s*s(?:ec)?\s*/\s*GPU',
                  part, re.IGNORECASE)
    if m:
      return float(m.group(1)), f'{m.group(1)} tokens/s/GPU'
    m = re.search(r'MFU\s*(\d+(?:\.\d+)?)\s*%', part, re.IGNORECASE) or (
      re.search(r'MFU', text, re.IGNORECASE) and
      re.search(r'(\d+(?:\.\d+)?)\s*%', part))
    if m:
      return float(m.group(1)) / 100 * peak_flops / flops_per_token, \
        f'MFU {m.group(1)}%'
    m = re.search(r'(\d+(?:\.\d+)?)\s*TFLOP', part, re.IGNORECASE)
    if m:
      if re.search(r'hardware', part, re.IGNORECASE) and \
         re.search(r'recompute|recomputation', part, re.IGNORECASE):
        return float(m.group(1)) * 1e12 * HFU_TO_MFU_FULL_RECOMPUTE / \
          flops_per_token, f'{m.group(1)} hardware TFLOP/s/GPU x 3/4'
      return float(m.group(1)) * 1e12 / flops_per_token, \
        f'{m.group(1)} TFLOP/s/GPU'
  return None, ''


def _facts(model):
  for pattern, facts in RUN_FACTS:
    if re.search(pattern, model.strip(), re.IGNORECASE):
      return facts
  return {}


def _dtype(row):
  """The datatype a row's texts name (None: not stated)."""
  text = ' '.join(str(row.get(k, '')) for k in ('dtype', 'parallelism',
                                                  'notes'))
  if re.search(r'\bbf16\b|bfloat16', text, re.IGNORECASE):
    return 'bf16'
  if re.search(r'\bfp16\b|float16', text, re.IGNORECASE):
    return 'fp16'
  return ''


@dataclass
class WholeRun:
  """One row priced.

  status: 'ok' (priced, with a published figure to compare with),
  'predicted' (priced, nothing published to compare with), 'not priced' or
  'infeasible'; row: the row with what :func:`_filled` supplied;
  assumptions: (what, value, why) not stated by the row; layout: 'stated' or 'searched'; run: the
  whole run's terms (:func:`calculon.plan.run.row`); execution: JSON.
  """
  row: dict
  status: str
  reason: str = ''
  assumptions: list = field(default_factory=list)
  approximations: list = field(default_factory=list)
  layout: str = ''
  system_name: str = ''
  system_file: str = ''
  gpus: int = None
  batch: int = None
  execution: dict = None
  run: dict = None
  published_rate: float = None
  published_rate_text: str = ''


class Suite:
  """The rows of a whole-runs file and what they map to.

  Args:
    base_dir: folder with models/, systems/ and validation/.
    path: the whole-runs CSV (default: the bundled one).
    conventions: the conventions file (default: the bundled one).
    systems: optional dict cluster (the hardware table's, else the system
      name) -> a system JSON object replacing the bundled file for its rows
      (calibrated systems; each row's field changes applied on top).
  """

  def __init__(self, base_dir, path=None, conventions=None, systems=None):
    from calculon.validation import conventions as conventions_mod
    from calculon.validation.mapping import Mapper
    self.base_dir = base_dir
    self.path = path or default_path(base_dir)
    conv = conventions_mod.load(conventions or
                                conventions_mod.default_path(base_dir))
    self.mapper = Mapper(base_dir, conv)
    self.frame = read_runs(self.path)
    self.systems = dict(systems or {})

  @property
  def cases(self):
    """Rows as the published suite's cases (for
    :func:`calculon.cli.validation.calibrated_systems`): the system name and
    cluster of each priceable row."""
    out = []
    for row in self.frame.to_dict('records'):
      row = _filled(row)[0]
      case = self.mapper.build(_pseudo_row(row, _count(row.get('num_gpus'))
                                           or 1, 1, (None,) * 4))
      out.append(case)
    return out

  def system(self, case):
    """The :class:`~calculon.hardware.System` of ``case``: its datasheet
    file (or its replacement in :attr:`systems`, the calibrated file with
    ``--calibrated``) with the row's changes."""
    from calculon.hardware import System
    from calculon.validation.mapping import apply_system_set
    override = self.systems.get(case.cluster or case.system_name)
    if override is not None:
      # A calibration fits the step; the whole-run sections (power,
      # storage, reliability) of the bundled file stay.
      base = self.mapper.system_json(case)
      override = dict(override, **{k: base[k] for k in (
        'reliability', 'storage', 'power') if k in base and
        k not in override})
      cfg = apply_system_set(override, case.system_set)
      return System(cfg, f'systems/{case.cluster or case.system_name}.json')
    return System(self.mapper.system_json(case),
                  self.mapper.system_source(case))

  def system_label(self, case):
    """The file :meth:`system` prices ``case`` on, as a table names it
    (:func:`calculon.validation.system_files.label`: file name and
    whether datasheet or calibrated)."""
    from calculon.validation.system_files import label
    override = self.systems.get(case.cluster or case.system_name)
    if override is not None:
      return label(f'{case.cluster or case.system_name}.json', override)
    return label(self.mapper.system_source(case), self.mapper.system_json(case))


def _pseudo_row(row, gpus, batch, layout, recompute='', seq_parallel=''):
  """The row in the published suite's columns, for the Mapper (an
  expert-parallel degree its parallelism text states written in the notes
  as ``ep=N``, the published suite's notes fact; ``recompute`` and
  ``seq_parallel`` the cells of those columns)."""
  tp, pp, dp, cp = layout
  ep = expert_par_from_text(row.get('parallelism'))
  notes = ' '.join(x for x in (row.get('parallelism', ''),
                               row.get('notes', ''),
                               f'ep={ep}' if ep else '') if x)
  return {
    'id': row['id'], 'source': row.get('source', ''),
    'model_name': row.get('model', ''),
    'num_layers': row.get('num_layers', ''), 'hidden': row.get('hidden', ''),
    'ffn_hidden': row.get('ffn_hidden', ''),
    'attn_heads': row.get('attn_heads', ''),
    'kv_heads': row.get('kv_heads', ''), 'seq_len': row.get('seq_len', ''),
    'vocab': row.get('vocab', ''), 'num_gpus': str(gpus),
    'gpu_type': row.get('gpu_type', ''),
    'tp': '' if tp is None else str(tp), 'pp': '' if pp is None else str(pp),
    'dp': '' if dp is None else str(dp), 'cp': '' if cp is None else str(cp),
    'vp': '', 'global_batch_size': str(batch), 'micro_batch_size': '',
    'recompute': recompute, 'seq_parallel': seq_parallel,
    'dtype': _dtype(row),
    'measured_metric_name': 'iteration_time_s', 'measured_value': '1',
    'notes': notes,
    'trained_from': str(row.get('trained_from') or '').strip()}


def _filled(row):
  """The row with the tokens, the GPU type and the month training began
  (``trained_from``) it leaves blank taken from its run facts
  (:data:`RUN_FACTS`), else the GPU type :data:`DEFAULT_GPU_TYPE`: (row
  copy, assumptions as (what, value, why))."""
  row = dict(row)
  facts = _facts(str(row.get('model', '')))
  said = []
  if _number(row.get('tokens_trained')) is None and facts.get('tokens'):
    row['tokens_trained'] = repr(float(facts['tokens']))
    said.append(('tokens', f"{facts['tokens']:.4g}", facts['why_tokens']))
  if not str(row.get('gpu_type') or '').strip():
    if facts.get('gpu_type'):
      row['gpu_type'] = facts['gpu_type']
      said.append(('gpu_type', facts['gpu_type'], facts['why_gpu_type']))
    else:
      row['gpu_type'] = DEFAULT_GPU_TYPE
      said.append(('gpu_type', DEFAULT_GPU_TYPE, 'not stated: the GPU most '
                   'runs of the bundled whole-runs file state (calculon.'
                   'validation.whole_runs.DEFAULT_GPU_TYPE)'))
  if not str(row.get('trained_from') or '').strip() and \
      facts.get('trained_from'):
    row['trained_from'] = facts['trained_from']
    said.append(('trained_from', facts['trained_from'],
                 facts['why_trained_from']))
  return row, said


def price_row(suite, row, workers=1):
  """Prices one row: a :class:`WholeRun` (status 'ok' when the row has a
  published GPU-hours, days or energy figure to compare with, 'predicted'
  when it has none, 'not priced' or 'infeasible' with the reason)."""
  row, said = _filled(row)
  out = WholeRun(row=row, status='not priced', assumptions=said)
  model = str(row.get('model', ''))
  facts = _facts(model)
  seq = _count(row.get('seq_len'))
  tokens = _number(row.get('tokens_trained'))
  if tokens is None:
    out.reason = 'tokens_trained not stated'
    return out
  predicted_only = not any(_number(row.get(m)) for m in METRICS)
  gpus = _count(row.get('num_gpus'))
  if gpus is None and facts.get('gpus'):
    gpus = facts['gpus']
    out.assumptions.append(('gpus', gpus, facts['why_gpus']))
  if gpus is None:
    for col in ('gpu_type', 'parallelism', 'notes'):
      gpus = _gpus_from_text(row.get(col))
      if gpus is not None:
        out.assumptions.append(('gpus', gpus, f'the scale the {col} text '
                                'states (the column is empty)'))
        break
  if gpus is None:
    gpus = DEFAULT_GPUS
    out.assumptions.append(('gpus', gpus, 'not stated: the scale of LLaMA '
                            '65B (arXiv 2302.13971 section 2.4) and '
                            'DeepSeek-V3 (arXiv 2412.19437 section 3.1), '
                            '2,048 GPUs (calculon.validation.whole_runs.'
                            'DEFAULT_GPUS)'))
  batch = _count(row.get('global_batch_size'))
  if batch is None and seq:
    batch = _batch_from_text(' '.join((row.get('parallelism', ''),
                                       row.get('notes', ''))), seq)
    if batch is not None:
      out.assumptions.append(('batch', batch, 'the parallelism or notes text '
                              f'({batch} x {seq} tokens)'))
  if batch is None and facts.get('batch'):
    batch = facts['batch']
    out.assumptions.append(('batch', batch, facts['why_batch']))
  if batch is None and seq:
    batch = max(1, DEFAULT_BATCH_TOKENS // seq)
    out.assumptions.append((
      'batch', batch, f'not stated: {DEFAULT_BATCH_TOKENS:,} tokens per '
      f'batch over the sequence {seq} (Llama 2, Llama 3, OLMo 2 '
      'pretraining)'))
  if batch is None:
    out.reason = 'global batch not stated'
    return out
  out.gpus, out.batch = gpus, batch
  stated = tuple(_count(row.get(k)) for k in ('tp', 'pp', 'dp', 'cp'))
  layout = stated if stated[0] else parse_layout(row.get('parallelism'),
                                                 gpus)
  tp, pp, dp, cp = layout
  if tp is not None and pp is None:
    pp = 1
    out.assumptions.append(('pp', 1, 'the parallelism text names TP and no '
                            'PP'))
  limits, choices, recompute, seq_parallel = {}, {}, '', ''
  if tp is None:
    limits, choices, recompute, seq_parallel = _stated_without_degrees(
      row, facts, out)
  case = suite.mapper.build(_pseudo_row(row, gpus, batch, (tp, pp, dp, cp),
                                        recompute, seq_parallel))
  out.assumptions += [(k, v, why) for k, v, why in case.assumptions
                      if k not in ('measured_metric_name',)]
  out.approximations += list(case.approximations)
  searched = tp is None
  blocking = [m for m in case.missing if not (
    searched and m.startswith('TP and PP not stated'))]
  if blocking or case.app is None:
    out.reason = '; '.join(blocking or case.missing)
    return out
  out.system_name = case.system_name
  out.system_file = suite.system_label(case)
  try:
    if searched:
      _searched(suite, case, out, tokens, workers, limits, choices)
    else:
      _stated(suite, case, out, tokens)
  except ConfigError as err:
    out.status, out.reason = 'not priced', str(err)
    return out
  if out.status == 'ok' and predicted_only:
    out.status = 'predicted'
  if out.status in ('ok', 'predicted'):
    from calculon.plan.run import system_rates
    system = suite.system(case)
    peak = system_rates(system, out.execution['datatype'])[0]
    per_token = out.run['model_flops_per_token']
    out.published_rate, out.published_rate_text = published_rate(
      row, gpus, per_token, peak)
  return out


def _stated_without_degrees(row, facts, out):
  """What the row's parallelism text (else its run facts'
  ``parallelism``) states of a layout it gives no degrees for
  (:func:`stated_techniques`), as the search's limits and choices and the
  recompute and seq_parallel cells: (limits, choices, recompute,
  seq_parallel), each taken recorded in ``out.assumptions``.  A text that
  names a data-parallel sharding and neither tensor nor pipeline
  parallelism states pure data parallelism: TP 1 and PP 1."""
  text, why = str(row.get('parallelism') or '').strip(), 'the parallelism text'
  if not text and facts.get('parallelism'):
    text, why = facts['parallelism'], facts['why_parallelism']
  said = stated_techniques(text)
  limits, choices, seq_parallel = {}, {}, ''
  if said['sharding']:
    choices['data_par_sharding'] = [said['sharding']]
    out.assumptions.append(('data_par_sharding', said['sharding'],
                            f'{why} names it'))
    if not said['tp'] and not said['pp']:
      limits['tp'] = limits['pp'] = ((1, 1),)
      for key in ('tp', 'pp'):
        out.assumptions.append((key, 1, f'{why} names a sharded data '
                                'parallelism and no TP or PP'))
  if said['tp']:
    limits['tp'] = ((2, math.inf),)
    out.assumptions.append(('tp', '>= 2', f'{why} names tensor (model) '
                            'parallelism without a degree: searched from 2'))
    if not said['pp']:
      limits['pp'] = ((1, 1),)
      out.assumptions.append(('pp', 1, f'{why} names TP and no PP'))
  if said['sp']:
    seq_parallel = 'yes'
    out.assumptions.append(('seq_parallel', 'yes', f'{why} names sequence '
                            'parallelism'))
  recompute = said['recompute']
  if facts.get('recompute'):
    recompute = facts['recompute']
    out.assumptions.append(('recompute', recompute, facts['why_recompute']))
  elif recompute:
    out.assumptions.append(('recompute', recompute, f'{why} names it'))
  return limits, choices, recompute, seq_parallel


def _inputs(system, tokens, case, out):
  from calculon.plan import run as RUN
  framework = case.fixed.get('framework')
  try:
    return RUN.run_inputs(system, tokens, framework)
  except ConfigError:
    out.assumptions.append(('checkpoint_policy', 'default', f'framework '
                            f'{framework!r} has no checkpoint policy of its '
                            'own (calculon.plan.framework)'))
    return RUN.run_inputs(system, tokens)


def _stated(suite, case, out, tokens):
  """The layout the row states, its unknown settings searched (the fastest
  feasible candidate, as the published suite prices)."""
  from calculon.llm.stats import stat_arrays
  from calculon.plan import run as RUN
  from calculon.validation.mapping import execution_at
  from calculon.validation.published import case_times
  system = suite.system(case)
  t, feasible, reason, ev = case_times(case, system)
  ok = feasible
  if not ok.any():
    ok = np.isfinite(t) & (np.asarray(reason) == _memory_code())
    if not ok.any():
      out.status, out.reason = 'infeasible', ev.reason_message(
        np.unravel_index(0, t.shape))
      return out
    out.approximations.append('no candidate fits the memory the model '
                              'estimates: the fastest priced anyway')
  best = np.unravel_index(int(np.argmin(np.where(ok, t, np.inf))), t.shape)
  record = execution_at(case, best)
  stats = {k: np.array([np.broadcast_to(np.asarray(v, dtype=float),
                                        t.shape)[best]])
           for k, v in stat_arrays(ev, RUN.RUN_STATS).items()}
  inputs = _inputs(system, tokens, case, out)
  terms = RUN.price_runs(_application(case), system, [record], inputs,
                        stats=(stats, np.array([True]), ['']))
  out.layout, out.execution = 'stated', record
  out.run, out.status = RUN.row(terms, 0), 'ok'
  return out


def _application(case):
  from calculon.config import Application
  return Application.from_dict(case.priced_app, f'model {case.id}')


def _memory_code():
  from calculon.llm.model import MEM1_TOO_SMALL
  return MEM1_TOO_SMALL


def _searched(suite, case, out, tokens, workers, limits=None, stated=None):
  """No layout stated: the fastest step of exactly the batch, searched
  (within ``limits``, :class:`calculon.search.grid.SearchSpec`'s, and the
  ``stated`` {axis: [values]}, from what the row states without
  degrees)."""
  from calculon.llm import search as S
  from calculon.plan import objective as O
  system = suite.system(case)
  app = _application(case)
  datatype = case.fixed['datatype']
  axes = S.MOE_AXES if app.is_moe else S.MODERN_AXES
  before = len(case.assumptions)
  framework, fields, choices = suite.mapper.search_settings(
    case, axes, stated)
  out.assumptions += case.assumptions[before:]
  out.assumptions.append(('layout', 'searched', 'the row states no TP/PP: '
                          'every layout of the framework preset\'s space ('
                          f'{framework}) within the rules above, the '
                          'fastest step'))
  spec = S.SearchSpec(app, system, out.gpus, out.batch, datatype,
                      framework=framework, fields=fields, choices=choices,
                      limits=dict(limits or {}))
  inputs = _inputs(system, tokens, case, out)
  result = O.rank(spec, 'throughput', 1, workers, inputs=inputs,
                  exact_batch=out.batch)
  if not result.best:
    out.status, out.reason = 'infeasible', 'no execution of this batch fits'
    return out
  top = result.best[0]
  out.layout, out.execution, out.run = 'searched', top.record, top.run
  out.status = 'ok'
  return out


def run_suite(suite, progress=None, workers=1):
  """Prices every row of ``suite``: a list of :class:`WholeRun`."""
  progress = progress or (lambda text: None)
  results = []
  for row in suite.frame.to_dict('records'):
    res = price_row(suite, row, workers)
    progress(f"  {row['id']} {row.get('model', '')}: {res.status}"
             + (f' ({res.reason})' if res.reason else ''))
    results.append(res)
  return results


def _error(pred, pub):
  if pred is None or pub is None or not math.isfinite(pred):
    return None
  return 100.0 * (pred / pub - 1.0)


def results_frame(results):
  """One row per run: id, model, GPUs, system, layout, tokens, step time,
  MFU, goodput, predicted and published GPU-hours, days and energy with
  their errors, status, the execution priced (JSON), assumptions,
  approximations, reason."""
  import pandas as pd
  rows = []
  for r in results:
    row, run = r.row, r.run or {}
    exe = r.execution or {}
    pred_energy = None
    if run:
      pw = run.get('energy_mwh')
      it = run.get('it_energy_mwh')
      gpu = run.get('gpu_energy_mwh')
      pue = pw / it if pw and it else None
      pred_energy = gpu * pue if gpu is not None and pue else None
    pub = {m: _number(row.get(m)) for m in METRICS}
    tokens = _number(row.get('tokens_trained'))
    rate_hours = rate_days = None
    if r.published_rate and run.get('goodput'):
      rate_hours = tokens / r.published_rate / 3600.0 / run['goodput']
      rate_days = rate_hours / r.gpus / 24.0
    pred = {'gpu_hours': run.get('gpu_hours'),
            'wall_days': run.get('wall_days'), 'energy_mwh': pred_energy}
    rows.append({
      'id': row['id'], 'model': row.get('model', ''), 'gpus': r.gpus,
      'gpu': str(row.get('gpu_type', '')).split(' (')[0],
      'system': r.system_name, 'system_file': r.system_file,
      'batch': r.batch,
      'layout': (f"{exe.get('tensor_par')}/{exe.get('pipeline_par')}/"
                 f"{exe.get('data_par')}" if exe else '') +
      (f" ({r.layout})" if r.layout else ''),
      'tokens': _number(row.get('tokens_trained')),
      'step_s': run.get('step_s'), 'mfu': run.get('mfu'),
      'goodput': run.get('goodput'),
      'pred_gpu_hours': pred['gpu_hours'],
      'pub_gpu_hours': pub['gpu_hours'],
      'err_gpu_hours_pct': _error(pred['gpu_hours'], pub['gpu_hours']),
      'pred_wall_days': pred['wall_days'],
      'pub_wall_days': pub['wall_days'],
      'err_wall_days_pct': _error(pred['wall_days'], pub['wall_days']),
      'pred_energy_mwh': pred['energy_mwh'],
      'pred_total_energy_mwh': run.get('energy_mwh'),
      'pub_energy_mwh': pub['energy_mwh'],
      'err_energy_pct': _error(pred['energy_mwh'], pub['energy_mwh']),
      'gpu_power_w': run.get('gpu_power_w'),
      'pub_rate_tokens_per_s_per_gpu': r.published_rate,
      'pub_rate': r.published_rate_text,
      'rate_gpu_hours': rate_hours,
      'err_rate_gpu_hours_pct': _error(rate_hours, pub['gpu_hours']),
      'rate_wall_days': rate_days,
      'err_rate_wall_days_pct': _error(rate_days, pub['wall_days']),
      'status': r.status,
      'execution': json.dumps(exe, sort_keys=True) if exe else '',
      'assumptions': '; '.join(f'{k}={v} ({why})'
                               for k, v, why in r.assumptions),
      'approximations': '; '.join(r.approximations),
      'reason': r.reason})
  return pd.DataFrame(rows)


def summary(frame):
  """Counts ('priced': with a published figure to compare with;
  'predicted': priced, nothing published) and, per metric, the rows
  compared and the median, mean and max |error| (percent), the median
  signed error and the rows predicted above and below the published
  figure ('above', 'below': whether the errors are one-sided; the
  predicted rows have no error, so no median or count holds them)."""
  out = {'rows': int(len(frame)),
         'priced': int((frame['status'] == 'ok').sum()),
         'predicted': int((frame['status'] == 'predicted').sum()),
         'not_priced': int((frame['status'] == 'not priced').sum()),
         'infeasible': int((frame['status'] == 'infeasible').sum())}
  for metric, col in (('gpu_hours', 'err_gpu_hours_pct'),
                      ('wall_days', 'err_wall_days_pct'),
                      ('energy', 'err_energy_pct'),
                      ('gpu_hours_at_published_rate',
                       'err_rate_gpu_hours_pct'),
                      ('wall_days_at_published_rate',
                       'err_rate_wall_days_pct')):
    errs = np.array([x for x in frame[col] if x is not None and
                     isinstance(x, (int, float)) and math.isfinite(x)],
                    dtype=float)
    if len(errs):
      a = np.abs(errs)
      out[metric] = {'n': int(len(errs)),
                     'median_abs_error_pct': float(np.median(a)),
                     'mean_abs_error_pct': float(a.mean()),
                     'max_abs_error_pct': float(a.max()),
                     'median_error_pct': float(np.median(errs)),
                     'above': int((errs > 0).sum()),
                     'below': int((errs < 0).sum())}
    else:
      out[metric] = {'n': 0, 'median_abs_error_pct': None,
                     'mean_abs_error_pct': None, 'max_abs_error_pct': None,
                     'median_error_pct': None, 'above': 0, 'below': 0}
  return out


def _fmt(value, spec):
  if value is None or (isinstance(value, float) and not math.isfinite(value)):
    return ''
  return format(value, spec)


def format_report(frame, verbose=False):
  """Readable text: the priced rows (predicted vs published; the
  predicted-only rows with no published figure beside them), the summary
  and the rows not priced with the reason."""
  import pandas as pd
  from calculon.validation.system_files import priced_on_line
  lines = ['error = 100 x (predicted / published - 1); energy: the GPUs\' '
           'predicted energy x PUE against the published figure (GPU power '
           'x hours x PUE in most sources)']
  ok = frame[frame['status'].isin(('ok', 'predicted'))]
  if len(ok):
    show = pd.DataFrame({
      'id': ok['id'] + ok['status'].map(
        lambda v: ' (predicted)' if v == 'predicted' else ''), 'GPUs': ok['gpus'].map(lambda v: _fmt(v, '.0f')),
      'system file': ok['system_file'],
      'TP/PP/DP': ok['layout'],
      'step s': ok['step_s'].map(lambda v: _fmt(v, '.2f')),
      'MFU': ok['mfu'].map(lambda v: _fmt(v and 100 * v, '.0f') + '%'),
      'goodput': ok['goodput'].map(lambda v: _fmt(v and 100 * v, '.1f') +
                                   '%'),
      'GPU-h pred': ok['pred_gpu_hours'].map(lambda v: _fmt(v, ',.0f')),
      'GPU-h pub': ok['pub_gpu_hours'].map(lambda v: _fmt(v, ',.0f')),
      'err': ok['err_gpu_hours_pct'].map(lambda v: _fmt(v, '+.1f')),
      'days pred': ok['pred_wall_days'].map(lambda v: _fmt(v, '.1f')),
      'days pub': ok['pub_wall_days'].map(lambda v: _fmt(v, '.1f')),
      'err ': ok['err_wall_days_pct'].map(lambda v: _fmt(v, '+.1f')),
      'MWh pred': ok['pred_energy_mwh'].map(lambda v: _fmt(v, ',.0f')),
      'MWh pub': ok['pub_energy_mwh'].map(lambda v: _fmt(v, ',.0f')),
      'err  ': ok['err_energy_pct'].map(lambda v: _fmt(v, '+.1f'))})
    lines += ['', show.to_string(index=False),
              priced_on_line(ok['system_file'])]
    rated = ok[ok['rate_gpu_hours'].notna()]
    if len(rated):
      show = pd.DataFrame({
        'id': rated['id'], 'published rate': rated['pub_rate'],
        'tok/s/GPU': rated['pub_rate_tokens_per_s_per_gpu'].map(
          lambda v: _fmt(v, '.0f')),
        'predicted tok/s/GPU': (rated['tokens'] / rated['pred_gpu_hours'] /
                                3600 / rated['goodput']).map(
          lambda v: _fmt(v, '.0f')),
        'GPU-h at that rate': rated['rate_gpu_hours'].map(
          lambda v: _fmt(v, ',.0f')),
        'GPU-h pub': rated['pub_gpu_hours'].map(lambda v: _fmt(v, ',.0f')),
        'err': rated['err_rate_gpu_hours_pct'].map(
          lambda v: _fmt(v, '+.1f')),
        'days at that rate': rated['rate_wall_days'].map(
          lambda v: _fmt(v, '.1f')),
        'days pub': rated['pub_wall_days'].map(lambda v: _fmt(v, '.1f')),
        'err ': rated['err_rate_wall_days_pct'].map(
          lambda v: _fmt(v, '+.1f'))})
      lines += ['', 'The whole-run layer alone: GPU-hours and days from the '
                'step rate the source publishes, divided by the predicted '
                'goodput:',
                show.to_string(index=False)]
    if verbose:
      from calculon.validation.published import assumption_lines
      lines += assumption_lines(ok)
  s = summary(frame)
  lines += ['', f"Summary: {s['rows']} rows: {s['priced']} priced against "
            f"a published figure, {s['predicted']} predicted (nothing "
            f"published to compare with), {s['infeasible']} infeasible, "
            f"{s['not_priced']} not priced"]
  for metric, label in (('gpu_hours', 'GPU-hours'), ('wall_days', 'days'),
                        ('energy', 'energy'),
                        ('gpu_hours_at_published_rate',
                         'GPU-hours at the published step rate'),
                        ('wall_days_at_published_rate',
                         'days at the published step rate')):
    m = s[metric]
    if m['n']:
      lines.append(f"  {label}: {m['n']} rows, |error| median "
                   f"{m['median_abs_error_pct']:.1f}%, mean "
                   f"{m['mean_abs_error_pct']:.1f}%, max "
                   f"{m['max_abs_error_pct']:.1f}%; median error "
                   f"{m['median_error_pct']:+.1f}%; {m['above']} above and "
                   f"{m['below']} below the published figure")
  no = frame[~frame['status'].isin(('ok', 'predicted'))]
  if len(no):
    lines += ['', 'Not priced (reason):']
    for _, r in no.iterrows():
      lines.append(f"  {r['id']} {r['model']}: {r['status']}: {r['reason']}")
  return '\n'.join(lines)


def plot(frame, folder):
  """Predicted against published GPU-hours (log-log) as
  ``folder/whole_runs_gpu_hours.png``; returns the paths written."""
  from calculon import outputs
  from calculon.plots.common import figure, save
  ok = frame[(frame['status'] == 'ok') & frame['pub_gpu_hours'].notna()
             & frame['pred_gpu_hours'].notna()]
  outputs.ensure_dir(folder)
  fig, ax = figure(6.0, 5.0)
  if len(ok):
    x = ok['pub_gpu_hours'].astype(float)
    y = ok['pred_gpu_hours'].astype(float)
    ax.scatter(x, y, color='tab:blue')
    for _, r in ok.iterrows():
      ax.annotate(r['id'], (r['pub_gpu_hours'], r['pred_gpu_hours']),
                  fontsize=7, textcoords='offset points', xytext=(4, 2))
    lo, hi = min(x.min(), y.min()) / 1.5, max(x.max(), y.max()) * 1.5
    ax.plot([lo, hi], [lo, hi], 'k--', lw=1, label='predicted = published')
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2],
                    color='gray', alpha=0.15, label='within 20 %')
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.legend(fontsize=8)
  ax.set_xlabel('published GPU-hours')
  ax.set_ylabel('predicted GPU-hours')
  ax.set_title('Whole pretraining runs')
  path = os.path.join(folder, 'whole_runs_gpu_hours.png')
  save(fig, path)
  return [path]
