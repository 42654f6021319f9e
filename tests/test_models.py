"""Bundled model files (models/*.json): they load, carry their sources, and
count the parameters their authors publish.

Two kinds of check:

* against the published count (within 0.5 %, or the rounding of a number
  published with two significant digits), each citing where it is published;
* exact, against a count written out by hand from the architecture (the
  arithmetic is in the test), which pins the engine's formulas.
"""

import glob
import os

import pytest

from calculon.cli.main import main
from calculon.config import Application
from conftest import load_json, repo, run_cli

MODELS = sorted(glob.glob(repo('models', '*.json')))
#: The files of this round (they must say what they are and where from).
NEW = ['llama2-7B', 'llama2-13B', 'llama2-70B', 'llama3-8B', 'llama3-70B',
       'llama3.1-405B', 'nemotron4-340B', 'qwen2.5-72B', 'gpt3-175B-vocab',
       'mixtral-8x7B', 'mixtral-8x22B', 'deepseek-v3', 'qwen3-30B-A3B',
       'qwen3-235B-A22B']


def app(name):
  return Application.from_dict(load_json(repo('models', name + '.json')),
                               name)


def non_embedding(a):
  parts = a.parameter_breakdown()
  return sum(parts.values()) - parts['embedding'] - parts['lm_head']


def test_new_models_are_bundled_with_name_and_source():
  names = {os.path.basename(m)[:-5] for m in MODELS}
  assert set(NEW) <= names
  for name in NEW:
    doc = load_json(repo('models', name + '.json'))
    assert doc['name'] and doc['source'], name
    assert doc.get('dropout', True) is (name == 'gpt3-175B-vocab'), name


# Published counts: (model, total, active or None, tolerance, source).
PUBLISHED = [
  ('llama3-8B', 8.03e9, None, 0.005,
   'Hugging Face meta-llama/Meta-Llama-3-8B model page: 8.03B params'),
  ('llama3-70B', 70.6e9, None, 0.005,
   'Hugging Face meta-llama/Meta-Llama-3-70B model page: 70.6B params'),
  ('llama3.1-405B', 405.9e9, None, 0.005,
   'Hugging Face meta-llama/Llama-3.1-405B model page (406B, i.e. 405.9B)'),
  ('llama2-7B', 6.74e9, None, 0.005,
   'Hugging Face meta-llama/Llama-2-7b-hf model page: 6.74B params'),
  ('llama2-13B', 13.0e9, None, 0.005,
   'Hugging Face meta-llama/Llama-2-13b-hf model page: 13B params'),
  ('llama2-70B', 69.0e9, None, 0.005,
   'Hugging Face meta-llama/Llama-2-70b-hf model page: 69B params'),
  ('nemotron4-340B', 331.6e9 + 9.4e9, None, 0.005,
   'arXiv:2406.11704 Sec. 2: 9.4B embedding + 331.6B non-embedding'),
  ('qwen2.5-72B', 72.7e9, None, 0.005,
   'Hugging Face Qwen/Qwen2.5-72B model card: 72.7B parameters'),
  ('gpt3-175B-vocab', 175.0e9, None, 0.005,
   'Brown et al. 2020, arXiv:2005.14165, Table 2.1: 175.0B'),
  ('mixtral-8x7B', 46.7e9, 12.9e9, 0.005,
   'mistral.ai/news/mixtral-of-experts: 46.7B total, 12.9B per token'),
  ('mixtral-8x22B', 141e9, 39e9, 0.005,
   'mistral.ai/news/mixtral-8x22b: 39B active out of 141B'),
  ('qwen3-30B-A3B', 30.5e9, None, 0.005,
   'Hugging Face Qwen/Qwen3-30B-A3B model card: 30.5B in total'),
  ('qwen3-235B-A22B', 235e9, None, 0.005,
   'arXiv:2505.09388 Sec. 2: 235B total parameters'),
  ('deepseek-v3', 671e9, None, 0.005,
   'arXiv:2412.19437 Sec. 4.2: 671B total parameters'),
  ('qwen3-8B', 8.2e9, None, 0.005,
   'Hugging Face Qwen/Qwen3-8B model card: 8.2B parameters'),
  ('gpt-oss-20b', 20.91e9, None, 0.005,
   'arXiv:2508.10925 Table 1: gpt-oss-20b 20.91B total parameters'),
  ('falcon-180B', 180e9, None, 0.01,
   'arXiv:2311.16867: Falcon-180B, 180B parameters (two digits: 178.6B '
   'counted with the tied embedding)'),
  ('deepseek-v2', 236e9, 21e9, 0.02,
   'arXiv:2405.04434 Sec. 3.1.2: 236B total parameters, 21B activated '
   '(two digits: 21.4B counted)'),
]


@pytest.mark.parametrize('name,total,active,tol,source', PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_parameter_count_matches_published(name, total, active, tol, source):
  a = app(name)
  assert a.num_parameters() == pytest.approx(total, rel=tol), source
  if active is not None:
    assert a.num_active_parameters() == pytest.approx(active, rel=tol), source


def test_nemotron4_split_matches_published():
  # arXiv:2406.11704 Sec. 2: 9.4B embedding and 331.6B non-embedding.
  # Embedding: untied input and output tables, 2 x 256,000 x 18,432.
  a = app('nemotron4-340B')
  parts = a.parameter_breakdown()
  assert parts['embedding'] + parts['lm_head'] == 2 * 256_000 * 18_432 \
    == 9_437_184_000
  assert non_embedding(a) == pytest.approx(331.6e9, rel=0.005)


def test_qwen_non_embedding_matches_model_cards():
  # Hugging Face model cards: Qwen2.5-72B 'Number of Parameters
  # (Non-Embedding): 70.0B'; Qwen3-30B-A3B '29.9B'.
  assert non_embedding(app('qwen2.5-72B')) == pytest.approx(70.0e9, rel=0.005)
  assert non_embedding(app('qwen3-30B-A3B')) == pytest.approx(29.9e9,
                                                              rel=0.005)
  # Qwen3-8B: 'Number of Parameters (Non-Embedding): 6.95B'.
  assert non_embedding(app('qwen3-8B')) == pytest.approx(6.95e9, rel=0.005)


def test_gpt_oss_20b_active_matches_model_card():
  # arXiv:2508.10925 Table 1: 3.61B active parameters per token, counted
  # without the embedding table (the unembedding is counted): 4 of 32
  # experts in each of 24 blocks.
  a = app('gpt-oss-20b')
  parts = a.parameter_breakdown()
  assert a.num_active_parameters() - parts['embedding'] == pytest.approx(
    3.61e9, rel=0.005)


def test_active_counts_published_with_two_digits():
  # Published active counts rounded to two significant digits; the exact
  # count with the embedding, the head and the router is 1.5 % (DeepSeek-V3,
  # 37B in arXiv:2412.19437 Sec. 4.2; 36.7B in its README_WEIGHTS.md), 1.6 %
  # (Qwen3-30B-A3B, 3.3B on its model card) and 0.9 % (Qwen3-235B-A22B, 22B
  # in arXiv:2505.09388 Sec. 2) above them.
  assert app('deepseek-v3').num_active_parameters() == pytest.approx(
    37e9, rel=0.02)
  assert app('qwen3-30B-A3B').num_active_parameters() == pytest.approx(
    3.3e9, rel=0.02)
  assert app('qwen3-235B-A22B').num_active_parameters() == pytest.approx(
    22e9, rel=0.01)


def test_llama3_8b_exact():
  # h 4096, 32 layers, 32 heads of 128, 8 K/V heads, SwiGLU 14336,
  # V 128,256 untied, RMSNorm, no biases (arXiv:2407.21783 Table 3).
  h, L, f, V, kv = 4096, 32, 14336, 128_256, 8 * 128
  attention = h * h + 2 * h * kv + h * h          # Q, K, V, O
  assert attention == 41_943_040
  mlp = 3 * h * f                                 # gate, up, down
  assert mlp == 176_160_768
  block = attention + mlp + 2 * h                 # two RMSNorms
  assert block == 218_112_000
  total = L * block + h + 2 * V * h               # final norm, table, head
  assert total == 8_030_261_248
  assert app('llama3-8B').num_parameters() == total


def test_llama2_70b_exact():
  # h 8192, 80 layers, 64 heads of 128, 8 K/V heads, SwiGLU 28672,
  # V 32,000 untied (arXiv:2307.09288; Hugging Face config.json).
  h, L, f, V, kv = 8192, 80, 28672, 32_000, 8 * 128
  block = (2 * h * h + 2 * h * kv) + 3 * h * f + 2 * h
  assert block == 150_994_944 + 704_643_072 + 16_384 == 855_654_400
  total = L * block + h + 2 * V * h
  assert total == 68_976_648_192
  assert app('llama2-70B').num_parameters() == total


def test_mixtral_8x7b_exact():
  # Llama-like attention (h 4096, 32 heads, 8 K/V heads of 128), 32 MoE
  # blocks of 8 SwiGLU experts (14336), top-2, router h x 8, V 32,000
  # untied (arXiv:2401.04088 Table 1).
  h, L, f, V, E, k = 4096, 32, 14336, 32_000, 8, 2
  attention = 2 * h * h + 2 * h * 1024
  expert = 3 * h * f
  router = h * E
  total = L * (attention + E * expert + router + 2 * h) + h + 2 * V * h
  active = L * (attention + k * expert + router + 2 * h) + h + 2 * V * h
  assert total == 46_702_792_704
  assert active == 12_879_925_248
  a = app('mixtral-8x7B')
  assert (a.num_parameters(), a.num_active_parameters()) == (total, active)


def test_deepseek_v3_exact():
  # arXiv:2412.19437 Sec. 4.2 and inference/configs/config_671B.json:
  # h 7168, 61 layers, 128 heads; MLA with q rank 1536, kv rank 512, qk
  # nope 128 + rope 64, v 128 (RMSNorm on both latents); 3 dense SwiGLU
  # blocks of 18432, then 58 MoE blocks of 256 routed experts (top-8) and 1
  # shared expert, all 2048 wide; router h x 256; V 129,280 untied.
  h, a, V = 7168, 128, 129_280
  q = 1536 * (h + a * (128 + 64) + 1)            # wq_a, q_norm, wq_b
  kv = 512 * (h + a * (128 + 128) + 1) + h * 64  # wkv_a, kv_norm, wkv_b
  o = a * 128 * h
  mla = q + kv + o
  assert mla == 187_107_328
  dense = mla + 3 * h * 18432 + 2 * h
  expert = 3 * h * 2048
  moe = mla + 256 * expert + expert + h * 256 + 2 * h
  moe_active = mla + 8 * expert + expert + h * 256 + 2 * h
  total = 3 * dense + 58 * moe + h + 2 * V * h
  active = 3 * dense + 58 * moe_active + h + 2 * V * h
  assert total == 671_026_404_352
  assert active == 37_552_282_624
  m = app('deepseek-v3')
  assert (m.num_parameters(), m.num_active_parameters()) == (total, active)


def test_gpt3_vocab_file_is_calculon_count_plus_final_norm():
  # Calculon counts GPT-3 175B with V = 51,200 and learned positions
  # (Narayanan et al. 2021, eq. 2); the vocabulary file ties the head to
  # that table and adds the final LayerNorm (scale and bias).
  old = app('gpt3-175B').num_parameters()
  assert app('gpt3-175B-vocab').num_parameters() == old + 2 * 12288


def test_every_bundled_model_loads_and_is_counted(capsys):
  from calculon.units import human_format
  for path in MODELS:
    a = Application.from_dict(load_json(path), path)
    assert main(['llm-parameter-calculator', path]) == 0
    name = os.path.basename(path)[:-5]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [name, '->'] + \
      human_format(a.num_parameters()).split()
    total = [l for l in lines if l.split()[0] == 'total'][0]
    assert int(total.split()[1].replace(',', '')) == a.num_parameters()


def test_parameter_calculator_cli_on_a_modern_model():
  out = run_cli('llm-parameter-calculator', repo('models', 'deepseek-v3.json'))
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].split() == ['deepseek-v3', '->', '671.026', 'G']
  active = [l for l in lines if l.split()[0] == 'active'][0]
  assert int(active.split()[1].replace(',', '')) == 37_552_282_624
