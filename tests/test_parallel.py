"""Issue 45, part 4: the rules on parallel degrees in one module
(calculon.config.parallel), vectorized; hand arithmetic."""

import numpy as np

from calculon.config import parallel as P


def test_derived_quantities():
  # 512 GPUs = TP 4 x PP 2 x DP 64 (x CP 1); batch 1,024 over DP 64 is 16
  # samples per replica, 16 microbatches of 1; 8,192 tokens a sample.
  assert P.procs(4, 2, 64) == 512 and P.procs(4, 2, 32, 2) == 512
  assert P.local_batch(1024, 64) == 16
  assert P.num_microbatches(1024, 64, 2) == 8
  assert P.tokens_per_microbatch(2, 8192, 4) == 4096
  assert P.largest_batch(48, 1000) == 960 and P.largest_batch(2000, 1000) \
    is None
  # 61 blocks over PP 4: 16 on the first stage, 3 stages one less.
  assert [int(x) for x in P.split_blocks(61, 4)] == [16, 3]
  assert [int(x) for x in P.split_blocks(80, 2)] == [40, 0]


def test_rules_are_vectorized():
  tp = np.array([1, 2, 4, 8, 16])
  # Llama 3 70B: 8 K/V heads fit TP 1..8 (divisor or multiple) and TP 16.
  assert P.kv_heads_fit_tp(8, tp).tolist() == [True] * 5
  assert P.kv_heads_fit_tp(6, np.array([2, 3, 4, 12])).tolist() == [
    True, True, False, True]
  cp = np.array([1, 2, 3, 4])
  # 2 x CP divides 8,192 for CP 1, 2, 4, not 3.
  assert P.cp_splits_sequence(8192, cp).tolist() == [True, True, False,
                                                     True]
  assert P.interleaving_needs_pp(np.array([1, 1, 2]),
                                 np.array([1, 2, 2])).tolist() == [
    True, False, True]
  # EP 8 x ETP 1 folds onto TP 2 x DP 4 x CP 1 = 8; EP 16 does not.
  assert P.experts_fold(2, 4, 1, np.array([8, 16]), 1).tolist() == [
    True, False]
  assert P.procs_match(np.array([512, 511]), 4, 2, 64).tolist() == [
    True, False]
  assert P.microbatch_divides(1024, 64, np.array([1, 3, 16])).tolist() == [
    True, False, True]
