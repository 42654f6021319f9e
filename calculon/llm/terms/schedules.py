"""The schedule table: the one place a pipeline schedule is defined.

For each schedule of ``pipeline_schedule``
(:data:`calculon.config.registry.PIPELINE_SCHEDULE_NAMES`) the table
(:data:`TABLE`, a :class:`Schedule` each) holds its bubble as a function
of the pipeline ranks p (``pipeline_par``), the microbatches m, the model
chunks a rank holds v (``pipeline_interleaving``) and one chunk's forward
F, full backward B (input gradient + weight gradient, with recomputation
and exposed communication) and weight-gradient W times; the microbatches
whose activations a rank keeps (in units of the rank's blocks, on the
first and on the last stage); the parameter copies a rank holds; the
pipeline communication it adds; where the embedding and the loss run; its
constraints (the chunks a rank holds, the ranks, the microbatches) and its
sources.  The vectorized functions below evaluate it over numpy columns
(schedule codes, p, m, v, F, B, W broadcastable).

Notation: F, B and W are the DualPipe README's (deepseek-ai/DualPipe
README.md, 3da1bbea5, "Pipeline Bubbles and Memory Usage Comparison"): B
is the *full* backward of a chunk and W its weight-gradient part, so Qi
et al.'s input-gradient time is B - W.  F&B, the time of a forward and a
backward chunk of two microbatches overlapped (DualPipe), is priced F + B:
the overlap hides communication, not compute, and the engine's F and B
already hold only the communication their block does not hide
(``moe_comm_overlap`` 'compute' for the expert all-to-alls of
Megatron-Core's combined 1F1B and DeepSeek-V3's DualPipe).

A schedule left out (``pipeline_schedule`` absent, code
:data:`~calculon.config.execution.UNSET`) is '1f1b', or
'interleaved-1f1b' with v > 1: Calculon's schedule, priced by
:meth:`calculon.llm.terms.schedule.ScheduleTerms.bubble_s` exactly as
before (Narayanan et al. SC21 eq. 1 per chunk, with the uneven split's
reduction and the interleaved wait for m mod p); :func:`legacy` says
where.  The other schedules' bubbles (:func:`bubble_s`) are of the
busiest stage's chunk times and grow with F and B at fixed W, so a lower
bound of F + B with the exact W bounds them from below
(:func:`calculon.search.bound.rate_bound`).

Reads nothing of the engine (the registry's names only); the engine's
:class:`~calculon.llm.terms.schedule.ScheduleTerms` (bubble),
:class:`~calculon.llm.terms.memory.MemoryTerms` (microbatches in flight,
parameter copies), :class:`~calculon.llm.terms.vocab.VocabTerms` (where
the embedding and the loss run) and
:class:`~calculon.llm.terms.pipeline.PipelineTerms` (the mirror copy's
gradient reduction) call it; the execution rules
(:data:`calculon.config.execution.RULES`) call :func:`violation`.
"""

from collections import namedtuple

import numpy as np

from calculon.config.registry import PIPELINE_SCHEDULE_NAMES

#: The engine's code of a schedule left out.
UNSET = -1

(ONE_F_ONE_B, INTERLEAVED_1F1B, GPIPE, LOOPED_BFS, ZB_H1, INTERLEAVED_ZB,
 ZBV, DUALPIPE, DUALPIPE_V) = range(len(PIPELINE_SCHEDULE_NAMES))

#: One row of the schedule table.
#:
#: * ``name``: the ``pipeline_schedule`` value.
#: * ``names``: what the frameworks call it ({framework: name}).
#: * ``chunks``: model chunks a rank holds, v: ``(min, max)`` (max None:
#:   any).
#: * ``bubble``: the bubble in words (F, B, W per chunk, see the module).
#: * ``in_flight``: microbatches of the rank's blocks whose activations
#:   the first stage keeps; ``last_in_flight``: the last stage's.
#: * ``param_copies``: copies of its stage's parameters a rank holds.
#: * ``comm``: the pipeline communication it adds to 1F1B's.
#: * ``ends``: where the embedding and the loss run.
#: * ``even_ranks``: p must be even; ``min_microbatches_per_rank``: m >= k
#:   p; ``even_microbatches``: m must be even.
#: * ``source``: where it is defined.
Schedule = namedtuple('Schedule', (
  'name names chunks bubble in_flight last_in_flight param_copies comm '
  'ends even_ranks min_microbatches_per_rank even_microbatches source'))

_TORCH = ('PyTorch torch/distributed/pipelining/schedules.py (00722e648b) '
          'get_schedule_class')

#: The schedule table, in code order.
TABLE = (
  Schedule(
    '1f1b', {'torchtitan': '1F1B', 'megatron-core': 'default (no '
             '--virtual-pipeline-model-parallel-size)'}, (1, 1),
    '(p - 1)(F + B), less the blocks the later stages lack when p does '
    'not divide the blocks', 'min(m, p)', '1', 1, 'none', 'embedding on the '
    'first rank, loss on the last', False, 0, False,
    'Narayanan et al. SC21, section 2.2.1 and eq. 1; Megatron-Core '
    'pipeline_parallel/schedules.py forward_backward_pipelining_without_'
    'interleaving; ' + _TORCH + ' Schedule1F1B'),
  Schedule(
    'interleaved-1f1b', {'torchtitan': 'Interleaved1F1B',
                         'megatron-core': '--virtual-pipeline-model-'
                         'parallel-size'}, (2, None),
    '(p - 1)(F + B) of a chunk, plus (v - 1)(p - m mod p) chunk times '
    'when p does not divide m, less the uneven split\'s blocks',
    'min(m, p)(1 + (p - 1)/(v p)) (capped at m with '
    'pipeline_warmup_capped)', '((v - 1) p + 1)/v', 1,
    'v transfers a microbatch each way', 'first and last rank', False, 0,
    False,
    'Narayanan et al. SC21, section 2.2.2; Korthikanti et al. 2022, '
    'section 4.2.3; Megatron-Core forward_backward_pipelining_with_'
    'interleaving; ' + _TORCH + ' ScheduleInterleaved1F1B'),
  Schedule(
    'gpipe', {'torchtitan': 'GPipe'}, (1, 1),
    '(p - 1)(F + B)', 'm', 'm', 1, 'none', 'first and last rank', False, 0,
    False,
    'Huang et al. 2019, GPipe, section 2.2 (bubble (p - 1)/(m + p - 1) of '
    'the step); ' + _TORCH + ' ScheduleGPipe (all forwards, then all '
    'backwards)'),
  Schedule(
    'looped-bfs', {'torchtitan': 'LoopedBFS'}, (2, None),
    '(p - 1)(F + B) of a chunk, plus (v - 1) max(p - m, 0) chunk times '
    '(a rank waits for the first microbatch to come back before its next '
    'chunk)', 'm', 'm', 1, 'v transfers a microbatch each way',
    'first and last rank', False, 0, False,
    'Lamy-Poirier 2022, Breadth-First Pipeline Parallelism (arXiv '
    '2211.05953), section 3; ' + _TORCH + ' ScheduleLoopedBFS (every '
    "microbatch through a rank's chunk, chunk after chunk)"),
  Schedule(
    'zb-h1', {'zero-bubble (sail-sg)': 'ZB-H1 (--enable-zero-bubble)'},
    (1, 1), '(p - 1) max(F + B - 2W, 0)', 'min(m, p)', '1', 1, 'none',
    'first and last rank', False, 0, False,
    'Qi et al. ICLR 2024, Zero Bubble Pipeline Parallelism (arXiv '
    '2401.10241), section 3.1, ZB-H1 (B - W their B); deepseek-ai/DualPipe '
    'README (3da1bbea5) table, ZB1P'),
  Schedule(
    'interleaved-zb', {'torchtitan': 'InterleavedZeroBubble'}, (2, None),
    '(p - 1) max(F + B - 2W, 0) of a chunk, plus the interleaved wait '
    '(v - 1)(p - m mod p) chunk times when p does not divide m',
    'as interleaved-1f1b', 'as interleaved-1f1b', 1,
    'v transfers a microbatch each way', 'first and last rank', False, 0,
    False,
    'Qi et al. ICLR 2024 (arXiv 2401.10241), ZB1P over interleaved '
    'chunks; ' + _TORCH + " ScheduleInterleavedZeroBubble ('implementing "
    "the ZB1P schedule in the paper')"),
  Schedule(
    'zbv', {'torchtitan': 'ZBVZeroBubble',
            'zero-bubble (sail-sg)': '--zero-bubble-v-schedule'}, (2, 2),
    '(p - 1) max(F + B - 3W, 0) of a chunk (zero at F = B - W = W, the '
    'paper\'s zero-bubble condition; linear in the chunk times as ZB-H1\'s '
    'is)', 'p (1F1B\'s peak)', 'p (the V puts both ends on the first '
    'rank)', 1, '2 transfers a microbatch each way (the README\'s 2x)',
    'embedding and loss both on the first rank (the V)', False, 2, False,
    'Qi et al. ICLR 2024 (arXiv 2401.10241), section 6, ZB-V; sail-sg/'
    'zero-bubble-pipeline-parallelism README (39f2c186a) table: bubble 0 '
    'at T_F = T_B = T_W, 1x activation memory, 2x pipeline communication; '
    + _TORCH + " ScheduleZBVZeroBubble ('requires exactly two stages per "
    "rank'); torchtitan torchtitan/distributed/pipeline_parallel.py "
    '(b5bcd76c6): microbatches >= stages'),
  Schedule(
    'dualpipe', {'DeepSeek': 'DualPipe (deepseek-ai/DualPipe)'}, (1, 1),
    '(p/2 - 1)(F&B + B - 3W) = (p/2 - 1) max(F + 2B - 3W, 0), p ranks = p '
    'stages', 'p + 1', 'p + 1', 2,
    'the mirrored stages\' gradients all-reduced between the two ranks '
    'that hold them; a second optimizer step over the copy',
    'embedding and loss on the first and the last rank (each holds both '
    'ends: its stage and the mirrored one)', True, 2, True,
    'DeepSeek-V3 technical report (arXiv 2412.19437), section 3.2.1 '
    '("DualPipe requires keeping two copies of the model parameters"); '
    'deepseek-ai/DualPipe README (3da1bbea5) table: bubble (PP/2 - 1)'
    '(F&B + B - 3W), 2x parameters, PP + 1 activations; dualpipe/'
    'dualpipe.py step: num_ranks % 2 == 0, num_chunks % 2 == 0 and '
    'num_chunks >= num_ranks * 2; examples/example_dualpipe.py: rank r '
    'holds stages r and PP - 1 - r'),
  Schedule(
    'dualpipe-v', {'torchtitan': 'DualPipeV',
                   'DeepSeek': 'DualPipeV (deepseek-ai/DualPipe)'}, (2, 2),
    '(2p/2 - 1)(F&B + B - 3W) = (p - 1) max(F + 2B - 3W, 0) of a chunk, '
    '2p stages on p ranks', 'p + 1/2 (the README\'s 2p + 1 chunk-'
    'microbatches of half a rank\'s blocks)', 'p + 1/2', 1,
    '2 transfers a microbatch each way',
    'embedding and loss both on the first rank (the V)', False, 2, False,
    'deepseek-ai/DualPipe README (3da1bbea5) table, DualPipeV on PP/2 '
    'devices: its "2x parameters" are per PP stage, and a rank holds two '
    'of the 2p stages (examples/example_dualpipev.py: rank r holds stages '
    'r and 2 PP - 1 - r), so a rank holds the parameters 1F1B over the '
    'same ranks holds; dualpipe/dualpipev.py step: num_chunks >= '
    'num_ranks * 2; ' + _TORCH + ' ScheduleDualPipeV (two stages per rank, '
    'microbatches >= stages)'),
)

assert tuple(s.name for s in TABLE) == PIPELINE_SCHEDULE_NAMES


def _codes(*names):
  return [PIPELINE_SCHEDULE_NAMES.index(n) for n in names]


def effective(schedule, interleaving):
  """The schedule codes with a schedule left out (UNSET) read as '1f1b',
  or 'interleaved-1f1b' where ``interleaving`` > 1 (int arrays,
  broadcast)."""
  return np.where(schedule == UNSET,
                  np.where(interleaving > 1, INTERLEAVED_1F1B, ONE_F_ONE_B),
                  schedule)


def legacy(schedule):
  """True where the schedule is Calculon's (left out, '1f1b' or
  'interleaved-1f1b'): priced by the engine's own bubble and memory
  formulas, bit for bit as before."""
  return np.isin(schedule, (UNSET, ONE_F_ONE_B, INTERLEAVED_1F1B))


def any_new(schedule):
  """Python bool: some execution uses a schedule other than Calculon's."""
  return bool(np.any(~legacy(np.asarray(schedule))))


def bubble_s(schedule, pp, nmb, v, fw, bw, wgrad):
  """The bubble (seconds) of the schedules other than Calculon's (the
  value is meaningless where :func:`legacy` holds).

  Args (arrays broadcastable over the executions):
    schedule: ``pipeline_schedule`` codes.
    pp, nmb, v: pipeline ranks, microbatches per replica, chunks a rank
      holds.
    fw, bw, wgrad: one chunk's forward, full backward and weight-gradient
      seconds of one microbatch (F, B, W; see the module).

  Returns:
    Seconds, >= 0, non-decreasing in ``fw`` and ``bw`` at fixed
    ``wgrad`` (each schedule's formula: :data:`TABLE`).
  """
  s = np.asarray(schedule)
  step = fw + bw
  plain = (pp - 1) * step
  zb1 = (pp - 1) * np.maximum(fw + bw - 2 * wgrad, 0)
  zbv = (pp - 1) * np.maximum(fw + bw - 3 * wgrad, 0)
  dual = np.maximum(fw + 2 * bw - 3 * wgrad, 0)
  missing = nmb % pp
  wait = np.where(missing != 0, (v - 1) * (pp - missing), 0) * step
  bfs_wait = (v - 1) * np.maximum(pp - nmb, 0) * step
  out = np.select(
    [s == GPIPE, s == LOOPED_BFS, s == ZB_H1, s == INTERLEAVED_ZB, s == ZBV,
     s == DUALPIPE, s == DUALPIPE_V],
    [plain, plain + bfs_wait, zb1, zb1 + wait, zbv,
     np.maximum(pp / 2 - 1, 0) * dual, (pp - 1) * dual], 0.0)
  return out


def in_flight(schedule, pp, nmb, legacy_first, legacy_last):
  """(first stage, last stage) microbatches in flight, in units of the
  rank's blocks: the table's, and ``legacy_first`` / ``legacy_last`` (the
  engine's 1F1B and interleaved factors) for Calculon's schedules and
  'interleaved-zb'.  Never more than the microbatches (a rank cannot keep
  more)."""
  s = np.asarray(schedule)
  mb = np.minimum(nmb, pp)
  first = np.select(
    [(s == GPIPE) | (s == LOOPED_BFS), s == ZB_H1, s == ZBV, s == DUALPIPE,
     s == DUALPIPE_V],
    [nmb, mb, mb, pp + 1.0, pp + 0.5], legacy_first)
  last = np.select(
    [(s == GPIPE) | (s == LOOPED_BFS), s == ZB_H1, s == ZBV, s == DUALPIPE,
     s == DUALPIPE_V],
    [nmb, np.minimum(1, nmb), mb, pp + 1.0, pp + 0.5], legacy_last)
  return np.minimum(first, np.maximum(nmb, 1)), \
    np.minimum(last, np.maximum(nmb, 1))


def v_shape(schedule):
  """True where a rank holds stages r and 2 PP - 1 - r (the V: 'zbv',
  'dualpipe-v')."""
  return np.isin(np.asarray(schedule), (ZBV, DUALPIPE_V))


def param_copies(schedule):
  """Copies of its stage's parameters (and their gradients and optimizer
  state) a rank holds: 2 for 'dualpipe', else 1."""
  return np.where(np.asarray(schedule) == DUALPIPE, 2, 1)


def ends_on_one_rank(schedule):
  """True where one rank runs both the embedding and the loss: the V
  schedules ('zbv', 'dualpipe-v': the first rank holds the first and the
  last stage) and 'dualpipe' (each end rank holds both ends)."""
  return np.isin(np.asarray(schedule), (ZBV, DUALPIPE, DUALPIPE_V))


def violation(schedule, pp, v, nmb):
  """Why each execution's schedule cannot run: an int array of reason
  codes (0: none; see :data:`VIOLATIONS`), for the execution rules and
  the search's valid combinations.

  Args (arrays broadcastable): ``pipeline_schedule`` codes, PP, VP,
  microbatches per replica.
  """
  s = np.asarray(schedule)
  lo = np.array([t.chunks[0] for t in TABLE])
  hi = np.array([t.chunks[1] or 1 << 30 for t in TABLE])
  even = np.array([t.even_ranks for t in TABLE])
  k = np.array([t.min_microbatches_per_rank for t in TABLE])
  even_m = np.array([t.even_microbatches for t in TABLE])
  c = np.maximum(s, 0)
  on = s != UNSET
  single = on & (pp == 1) & (s != ONE_F_ONE_B)
  chunks = on & ~single & ((v < lo[c]) | (v > hi[c]))
  ranks = on & ~single & even[c] & (pp % 2 != 0)
  micro = on & ~single & ((nmb < k[c] * pp) | (even_m[c] & (nmb % 2 != 0)))
  return np.select([single, chunks, ranks, micro], [1, 2, 3, 4], 0)


#: Reason codes of :func:`violation` and their messages' heads.
VIOLATIONS = {
  1: 'needs pipeline_par > 1 (only "1f1b" with pipeline_par = 1)',
  2: 'needs another pipeline_interleaving',
  3: 'needs an even pipeline_par',
  4: 'needs more microbatches per replica',
}


def violation_message(code, name):
  """The rule's message for reason ``code`` of schedule ``name``."""
  t = TABLE[PIPELINE_SCHEDULE_NAMES.index(name)]
  if code == 2:
    lo, hi = t.chunks
    want = f'= {lo}' if lo == hi else f'>= {lo}'
    return f'needs pipeline_interleaving {want} (model chunks a rank holds)'
  if code == 4:
    need = f'>= {t.min_microbatches_per_rank} x pipeline_par' \
      if t.min_microbatches_per_rank else ''
    if t.even_microbatches:
      need = (need + ' and ' if need else '') + 'even'
    return ('needs microbatches per replica (batch_size / data_par / '
            f'microbatch_size) {need}')
  return VIOLATIONS[code]
