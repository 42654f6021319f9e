"""Batch totals and the figures of merit: the batch time, the sample and
token rates, the efficiencies, model and hardware FLOP, MFU and HFU.

Provides :class:`MetricsTerms`: ``total_time_s`` (Calculon's terms in
Calculon's order plus the other concerns' ``modern_time_s``),
``time_breakdown_s`` (the same terms one by one, name -> seconds),
``sample_rate``, ``tokens_per_s``, ``useful_flops``,
``compute_efficiency``, ``system_efficiency``, ``total_efficiency``,
``model_flops_per_batch``, ``model_flops_per_batch_causal``,
``model_tflops_per_proc``, ``mfu``, ``mfu_causal``, ``num_parameters``,
``num_active_parameters``, ``hardware_flops_per_proc``, ``hfu``.

Reads: ``app``, ``system``, ``exe``, ``pp``, ``training``
(:mod:`~calculon.llm.terms.base`); ``block``, ``fw_time_s``,
``bw_time_s``, ``optim_step_time_s``, ``recompute_time_s``
(:mod:`~calculon.llm.terms.blocks`); ``blocks_per_proc``,
``num_microbatches``, ``block_microbatches``, ``bubble_time_s``
(:mod:`~calculon.llm.terms.schedule`); ``fw_offload_exposed_time_s``,
``bw_offload_exposed_time_s`` (:mod:`~calculon.llm.terms.offload`);
``recomm_exposed_time_s``, ``tp_comm_exposed_time_s``
(:mod:`~calculon.llm.terms.tensor`); ``pp_comm_exposed_time_s``
(:mod:`~calculon.llm.terms.pipeline`); ``dp_comm_exposed_time_s``
(:mod:`~calculon.llm.terms.data`); ``modern_time_s``
(:mod:`~calculon.llm.terms.evaluation`); ``embed``, ``head``
(:mod:`~calculon.llm.terms.vocab`).
"""

from functools import cached_property

import numpy as np

#: Calculon's terms of the batch time: (name, Evaluation attribute), in
#: the order :attr:`MetricsTerms.total_time_s` sums them.  Each name is
#: the statistic's (:mod:`calculon.llm.stats`).
CALCULON_TIME_TERMS = (
  ('fw_time', 'fw_time_s'), ('bw_time', 'bw_time_s'),
  ('optim_step_time', 'optim_step_time_s'),
  ('fw_offload_exposed_time', 'fw_offload_exposed_time_s'),
  ('bw_offload_exposed_time', 'bw_offload_exposed_time_s'),
  ('recompute_time', 'recompute_time_s'),
  ('recomm_exposed_time', 'recomm_exposed_time_s'),
  ('bubble_time', 'bubble_time_s'),
  ('tp_comm_exposed_time', 'tp_comm_exposed_time_s'),
  ('pp_comm_exposed_time', 'pp_comm_exposed_time_s'),
  ('dp_comm_exposed_time', 'dp_comm_exposed_time_s'))
#: The statistic's name of a concern's batch term (its ``CONCERN.batch``
#: attribute) where it is not the attribute less ``_s``.
BATCH_TERM_NAMES = {'vocab_extra_time_s': 'embedding_lm_head_time'}


def batch_term_name(attr):
  """The name in :attr:`MetricsTerms.time_breakdown_s` of a concern's
  batch term ``attr`` (an Evaluation attribute ending in ``_s``)."""
  return BATCH_TERM_NAMES.get(attr, attr[:-2] if attr.endswith('_s')
                              else attr)


class MetricsTerms:
  """Batch totals and figures of merit (see the module)."""

  @cached_property
  def total_time_s(self):
    """Time of one batch: compute, exposed offload, recomputation, exposed
    redone TP communication, bubble, exposed TP/PP/DP communication
    (Calculon's terms, summed in its order), plus what the other concerns
    declare (``modern_time_s``, :mod:`~calculon.llm.terms.evaluation`)."""
    total = (self.fw_time_s + self.bw_time_s + self.optim_step_time_s +
             self.fw_offload_exposed_time_s + self.bw_offload_exposed_time_s +
             self.recompute_time_s + self.recomm_exposed_time_s +
             self.bubble_time_s + self.tp_comm_exposed_time_s +
             self.pp_comm_exposed_time_s + self.dp_comm_exposed_time_s)
    return total + self.modern_time_s

  @cached_property
  def time_breakdown_s(self):
    """The terms of :attr:`total_time_s` one by one: a dict name -> seconds
    (array or scalar), in the order it sums them: Calculon's
    (:data:`CALCULON_TIME_TERMS`), then every concern's declared batch
    terms in the order of the concerns (the host optimizer step, exposed
    CP ring and FSDP traffic, FSDP's buffer copies, the embedding, LM
    head and loss, exposed expert-parallel traffic, the fixed overheads,
    the MoE host floor), 0.0 where the concern does not apply.  Every
    term is >= 0 but ``embedding_lm_head_time``, what the vocabulary adds
    net of the block each end stage no longer builds with
    ``pipeline_split_counts_vocab`` (:attr:`~calculon.llm.terms.vocab.
    VocabTerms.vocab_time_s`), which can be negative.  The values sum to :attr:`total_time_s` to float rounding (the same
    numbers, added in one chain instead of two)."""
    parts = {name: getattr(self, attr) for name, attr in CALCULON_TIME_TERMS}
    for concern in self.CONCERNS:
      applies = None
      for attr in concern.batch:
        if applies is None:
          applies = concern.applies(self)
        parts[batch_term_name(attr)] = getattr(self, attr) if applies else 0.0
    return parts

  @cached_property
  def sample_rate(self):
    """Samples per second: global batch / batch time."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.exe.batch_size / self.total_time_s

  # -- efficiencies -----------------------------------------------------------
  @cached_property
  def useful_flops(self):
    """FLOP of one block and microbatch (forward; plus backward and optimizer
    when training), including TP reduction arithmetic."""
    b = self.block
    return b.fw_flops + np.where(self.training, b.useful_bw_flops, 0)

  @cached_property
  def _perfect_time_s(self):
    peak = self.system.matrix.peak_flops(self.exe.datatype)
    return self.blocks_per_proc * self.num_microbatches * self.useful_flops / \
      peak

  @cached_property
  def _compute_time_s(self):
    return self.fw_time_s + self.bw_time_s + self.optim_step_time_s

  @cached_property
  def compute_efficiency(self):
    """Useful FLOP at matrix peak / time spent computing."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self._perfect_time_s / self._compute_time_s

  @cached_property
  def system_efficiency(self):
    """Time spent computing / batch time."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self._compute_time_s / self.total_time_s

  @cached_property
  def total_efficiency(self):
    """Useful FLOP at matrix peak / batch time (MFU-like, counting the
    model's block FLOP including recomputation-free backward)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self._perfect_time_s / self.total_time_s

  # -- speed in the field's units ---------------------------------------------
  @cached_property
  def tokens_per_s(self):
    """Tokens per second: sample rate x sequence length."""
    return self.sample_rate * self.app.seq_size

  def _model_flops(self, convention):
    from calculon.llm.flops import model_flops_per_token
    per_token = model_flops_per_token(self.app, convention)
    flops = float(per_token) * self.exe.batch_size * self.app.seq_size
    return np.where(self.training, flops, flops / 3)

  @cached_property
  def model_flops_per_batch(self):
    """Model FLOP of one batch with the whole attention score matrix
    (PaLM's 6N + 12LHQT, torchtitan; :mod:`calculon.llm.flops`), one third
    of it for inference (forward only).  Recomputation is not model FLOP."""
    return self._model_flops('full')

  @cached_property
  def model_flops_per_batch_causal(self):
    """Model FLOP of one batch with half the attention score matrix
    (Megatron-LM since 2025, NeMo)."""
    return self._model_flops('causal')

  @cached_property
  def _peak_flops(self):
    return self.system.matrix.peak_flops(self.exe.datatype)

  @cached_property
  def model_tflops_per_proc(self):
    """Model TFLOP/s achieved per processor (model FLOP / batch time /
    processors / 1e12)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.model_flops_per_batch / self.exe.num_procs / \
        self.total_time_s / 1e12

  @cached_property
  def mfu(self):
    """Model FLOP utilization: model FLOP/s per processor / matrix peak
    (whole-attention convention, :attr:`model_flops_per_batch`)."""
    return self.model_tflops_per_proc * 1e12 / self._peak_flops

  @cached_property
  def mfu_causal(self):
    """MFU with the causal convention (:attr:`model_flops_per_batch_causal`,
    Megatron-LM since 2025 and NeMo)."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.model_flops_per_batch_causal / self.exe.num_procs / \
        self.total_time_s / self._peak_flops

  @cached_property
  def num_parameters(self):
    """Trainable parameters of the model (elements)."""
    return float(self.app.num_parameters())

  @cached_property
  def num_active_parameters(self):
    """Parameters a token uses (MoE: top_k routed experts)."""
    return float(self.app.num_active_parameters())

  @cached_property
  def hardware_flops_per_proc(self):
    """FLOP one processor executes per batch: every block's forward,
    recomputation, backward, TP reduction arithmetic, and the optimizer."""
    b = self.block
    work = b.fw_flops + b.re_flops + b.agrad_flops + b.wgrad_flops
    out = self.block_microbatches * work + self.blocks_per_proc * b.optim_flops
    if self.app.has_vocab:
      # The embedding and the head run on different stages (PP > 1): the
      # busier of the two processors.
      e, h = self.embed, self.head
      ef = self.num_microbatches * (e.fw_flops + e.agrad_flops +
                                    e.wgrad_flops) + e.optim_flops
      hf = self.num_microbatches * (h.fw_flops + h.agrad_flops +
                                    h.wgrad_flops) + h.optim_flops
      out = out + np.where(self.pp > 1, np.maximum(ef, hf), ef + hf)
    return out

  @cached_property
  def hfu(self):
    """Hardware FLOP utilization: executed FLOP/s / matrix peak."""
    with np.errstate(divide='ignore', invalid='ignore'):
      return self.hardware_flops_per_proc / self.total_time_s / \
        self._peak_flops
