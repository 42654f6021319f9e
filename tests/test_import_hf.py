"""`calculon import-hf`: Hugging Face config.json -> application.

Each family is checked on a small inline config against a parameter count
written out by hand from the family's transformers modeling file, so a
mapping mistake (a missing bias, a wrong K/V width, a dense layer counted as
MoE) changes the number."""

import json
import os

import pytest

from calculon.cli.hf import check_output
from calculon.config import Application
from calculon.errors import ConfigError
from calculon.hf import application_from_hf
from conftest import load_json, run_cli

# meta-llama/Meta-Llama-3-8B config.json, official values.
LLAMA3_8B = {
  'architectures': ['LlamaForCausalLM'], 'attention_bias': False,
  'attention_dropout': 0.0, 'bos_token_id': 128000, 'eos_token_id': 128001,
  'hidden_act': 'silu', 'hidden_size': 4096, 'initializer_range': 0.02,
  'intermediate_size': 14336, 'max_position_embeddings': 8192,
  'model_type': 'llama', 'num_attention_heads': 32, 'num_hidden_layers': 32,
  'num_key_value_heads': 8, 'pretraining_tp': 1, 'rms_norm_eps': 1e-05,
  'rope_scaling': None, 'rope_theta': 500000.0, 'tie_word_embeddings': False,
  'torch_dtype': 'bfloat16', 'transformers_version': '4.40.0.dev0',
  'use_cache': True, 'vocab_size': 128256}


def convert(cfg, **kw):
  """(application, notes, Application) of an inline config."""
  app, notes = application_from_hf(cfg, 'config.json', **kw)
  return app, notes, Application.from_dict(app, 'config.json')


def write(tmp_path, cfg, name='config.json'):
  path = tmp_path / name
  path.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
  return str(path)


def test_llama3_8b_cli(tmp_path):
  folder = tmp_path / 'Meta-Llama-3-8B'
  folder.mkdir()
  config = write(folder, LLAMA3_8B)
  out = str(tmp_path / 'llama3.json')
  res = run_cli('import-hf', config, out)
  assert res.returncode == 0, res.stderr
  assert '8.030 G parameters' in res.stdout
  doc = load_json(out)
  assert doc['name'] == 'Meta-Llama-3-8B' and config in doc['source']
  app = Application.from_dict(doc, out)
  assert app.num_parameters() == 8_030_261_248
  assert (app.kv_heads, app.mlp, app.norm, app.linear_bias, app.seq_size,
          app.tied_embeddings, app.position_embedding, app.dropout) == \
    (8, 'gated', 'rmsnorm', 'none', 8192, False, 'rope', False)
  assert sorted(os.listdir(tmp_path)) == ['Meta-Llama-3-8B', 'llama3.json']


def test_seq_option_and_name():
  app, notes, _ = convert(LLAMA3_8B, seq=4096, name='Llama 3 8B')
  assert app['seq_size'] == 4096 and app['name'] == 'Llama 3 8B'
  assert any('command line' in n for n in notes)


def test_mixtral():
  # modeling_mixtral.py: Llama attention, every layer a sparse MoE block of
  # num_local_experts SwiGLU experts (w1, w3: h x f; w2: f x h) and a gate
  # h x E, no biases, untied head.
  cfg = {'model_type': 'mixtral', 'hidden_size': 64, 'intermediate_size': 96,
         'num_attention_heads': 4, 'num_key_value_heads': 2,
         'num_hidden_layers': 2, 'num_local_experts': 4,
         'num_experts_per_tok': 2, 'vocab_size': 100, 'rms_norm_eps': 1e-5,
         'max_position_embeddings': 128, 'sliding_window': None,
         'tie_word_embeddings': False}
  _, _, app = convert(cfg)
  h, L, V, f, E, k = 64, 2, 100, 96, 4, 2
  attention = 2 * h * h + 2 * h * (2 * 16)
  expert = 3 * h * f
  total = L * (attention + E * expert + h * E + 2 * h) + h + 2 * V * h
  active = L * (attention + k * expert + h * E + 2 * h) + h + 2 * V * h
  assert (app.num_parameters(), app.num_active_parameters()) == \
    (total, active) == (185_664, 111_936)


def test_qwen2_has_qkv_biases():
  # modeling_qwen2.py: q_proj, k_proj, v_proj with bias, o_proj without.
  cfg = {'model_type': 'qwen2', 'hidden_size': 64, 'intermediate_size': 160,
         'num_attention_heads': 8, 'num_key_value_heads': 2,
         'num_hidden_layers': 3, 'vocab_size': 120, 'rms_norm_eps': 1e-6,
         'max_position_embeddings': 256, 'sliding_window': 32,
         'use_sliding_window': False, 'tie_word_embeddings': True,
         'attention_dropout': 0.0}
  app, _, a = convert(cfg)
  assert app['linear_bias'] == 'qkv'
  h, d, g, L, V, f = 64, 8, 2, 3, 120, 160
  attention = 2 * h * h + 2 * h * g * d + (h + 2 * g * d)
  block = attention + 3 * h * f + 2 * h
  assert a.num_parameters() == L * block + h + V * h == 131_296


def test_qwen2_moe_shared_expert_and_sparse_step():
  # modeling_qwen2_moe.py: layer i is MoE when (i + 1) % decoder_sparse_step
  # == 0; a MoE layer has E experts, a shared expert of
  # shared_expert_intermediate_size and a gate; the others a dense MLP.
  cfg = {'model_type': 'qwen2_moe', 'hidden_size': 32,
         'intermediate_size': 64, 'moe_intermediate_size': 16,
         'shared_expert_intermediate_size': 48, 'num_experts': 6,
         'num_experts_per_tok': 2, 'decoder_sparse_step': 2,
         'mlp_only_layers': [], 'num_attention_heads': 4,
         'num_key_value_heads': 4, 'num_hidden_layers': 4,
         'vocab_size': 50, 'rms_norm_eps': 1e-6,
         'max_position_embeddings': 64, 'tie_word_embeddings': False}
  app, notes, a = convert(cfg)
  assert (app['moe_layer_freq'], app['shared_experts'],
          app['shared_expert_ffn_hidden']) == (2, 1, 48)
  h, L, V = 32, 4, 50
  attention = 4 * h * h + 3 * h          # MHA with Q, K, V biases
  dense = attention + 3 * h * 64 + 2 * h
  moe = attention + 6 * 3 * h * 16 + 3 * h * 48 + h * 6 + 2 * h
  assert a.num_parameters() == 2 * dense + 2 * moe + h + 2 * V * h
  assert any('gate' in n for n in notes)


def test_qwen2_moe_dense_layers_not_first_is_an_error():
  cfg = {'model_type': 'qwen2_moe', 'hidden_size': 32,
         'intermediate_size': 64, 'moe_intermediate_size': 16,
         'num_experts': 4, 'num_experts_per_tok': 2,
         'mlp_only_layers': [2], 'num_attention_heads': 4,
         'num_hidden_layers': 4, 'vocab_size': 50,
         'max_position_embeddings': 64}
  with pytest.raises(ConfigError, match="'mlp_only_layers' = \\[2\\]"):
    convert(cfg)


def test_qwen3_moe_notes_qk_norm():
  cfg = {'model_type': 'qwen3_moe', 'hidden_size': 32, 'head_dim': 16,
         'intermediate_size': 64, 'moe_intermediate_size': 8,
         'num_experts': 8, 'num_experts_per_tok': 2, 'num_attention_heads': 4,
         'num_key_value_heads': 2, 'num_hidden_layers': 2, 'vocab_size': 40,
         'rms_norm_eps': 1e-6, 'max_position_embeddings': 64,
         'tie_word_embeddings': False, 'attention_bias': False}
  app, notes, a = convert(cfg)
  assert app['attn_size'] == 16 and 'shared_experts' not in app
  h, q, kv, L, V = 32, 4 * 16, 2 * 16, 2, 40
  block = 2 * h * q + 2 * h * kv + 8 * 3 * h * 8 + h * 8 + 2 * h
  assert a.num_parameters() == L * block + h + 2 * V * h
  assert any('QK-Norm' in n for n in notes)


def test_deepseek_v3():
  # modeling_deepseek.py: MLA (q_a_proj h x r_q, q_a_layernorm, q_b_proj
  # r_q x a(d_n + d_r), kv_a_proj_with_mqa h x (r_kv + d_r),
  # kv_a_layernorm, kv_b_proj r_kv x a(d_n + d_v), o_proj a d_v x h);
  # layers < first_k_dense_replace dense, then MoE with n_shared_experts.
  cfg = {'model_type': 'deepseek_v3', 'hidden_size': 64,
         'intermediate_size': 128, 'moe_intermediate_size': 16,
         'n_routed_experts': 8, 'n_shared_experts': 1,
         'num_experts_per_tok': 2, 'first_k_dense_replace': 1,
         'moe_layer_freq': 1, 'num_attention_heads': 4,
         'num_key_value_heads': 4, 'num_hidden_layers': 3,
         'q_lora_rank': 24, 'kv_lora_rank': 16, 'qk_nope_head_dim': 8,
         'qk_rope_head_dim': 4, 'v_head_dim': 8, 'vocab_size': 90,
         'rms_norm_eps': 1e-6, 'max_position_embeddings': 128,
         'tie_word_embeddings': False, 'topk_method': 'noaux_tc',
         'num_nextn_predict_layers': 1}
  app, notes, a = convert(cfg)
  assert 'kv_heads' not in app and app['attn_size'] == 12
  h, n_h = 64, 4
  mla = (h * 24 + 24 + 24 * n_h * 12 + h * (16 + 4) + 16 + 16 * n_h * 16 +
         n_h * 8 * h)
  expert = 3 * h * 16
  dense = mla + 3 * h * 128 + 2 * h
  moe = mla + 8 * expert + expert + h * 8 + 2 * h
  moe_active = mla + 2 * expert + expert + h * 8 + 2 * h
  assert a.num_parameters() == dense + 2 * moe + h + 2 * 90 * h
  assert a.num_active_parameters() == dense + 2 * moe_active + h + 2 * 90 * h
  assert any('multi-token' in n for n in notes)
  # Group-limited routing: n_group groups, topk_group of them per token
  # (modeling_deepseek.py); one group (or none given) is no limit.
  assert 'moe_router_num_groups' not in app
  app, _, _ = convert(dict(cfg, n_group=4, topk_group=2))
  assert (app['moe_router_num_groups'], app['moe_router_group_topk']) == \
    (4, 2)
  assert 'moe_router_num_groups' not in convert(dict(cfg, n_group=1,
                                                     topk_group=1))[0]
  assert any('score-correction' in n for n in notes)


def test_gpt_neox_parallel_residual_with_biases():
  # modeling_gpt_neox.py: fused query_key_value (3h x h + 3h), dense, MLP
  # h -> intermediate -> h, all with biases; two LayerNorms read the same
  # input (use_parallel_residual); untied embed_out.
  cfg = {'model_type': 'gpt_neox', 'hidden_size': 48,
         'intermediate_size': 192, 'num_attention_heads': 6,
         'num_hidden_layers': 2, 'vocab_size': 70,
         'max_position_embeddings': 64, 'layer_norm_eps': 1e-5,
         'rotary_pct': 0.25, 'use_parallel_residual': True,
         'tie_word_embeddings': False}
  app, notes, a = convert(cfg)
  assert (app['block_layout'], app['linear_bias'], app['norm'], app['mlp'],
          app['position_embedding']) == ('parallel', 'all', 'layernorm',
                                         'plain', 'rope')
  h, f, L, V = 48, 192, 2, 70
  block = (4 * h * h + 4 * h) + (2 * h * f + f + h) + 2 * 2 * h
  assert a.num_parameters() == L * block + 2 * h + 2 * V * h == 63_360
  assert any('rotary_pct' in n for n in notes)


def test_gpt2_learned_positions_tied():
  # modeling_gpt2.py: wte V x h (tied to lm_head), wpe n_positions x h,
  # c_attn h x 3h + 3h, c_proj, c_fc h x 4h (n_inner None), all biased;
  # ln_1, ln_2, ln_f. 124M: the published GPT-2 small count, 124,439,808.
  cfg = {'model_type': 'gpt2', 'n_embd': 768, 'n_head': 12, 'n_layer': 12,
         'n_positions': 1024, 'n_ctx': 1024, 'n_inner': None,
         'vocab_size': 50257, 'layer_norm_epsilon': 1e-5,
         'resid_pdrop': 0.1, 'embd_pdrop': 0.1, 'attn_pdrop': 0.1}
  app, _, a = convert(cfg)
  assert (app['position_embedding'], app['tied_embeddings'],
          app['dropout'], app['seq_size']) == ('learned', True, True, 1024)
  h, L = 768, 12
  block = (4 * h * h + 4 * h) + (8 * h * h + 5 * h) + 4 * h
  total = L * block + 2 * h + 50257 * h + 1024 * h
  assert a.num_parameters() == total == 124_439_808


def test_falcon_new_and_old_architecture():
  # modeling_falcon.py: fused query_key_value of (heads + 2 kv) head_dim
  # columns, dense, MLP h -> 4h -> h, no biases (bias false), parallel
  # attention/MLP; new architecture: num_kv_heads and two LayerNorms
  # (ln_attn, ln_mlp); old: multi_query (1 K/V head), one LayerNorm.
  new = {'model_type': 'falcon', 'hidden_size': 64,
         'num_attention_heads': 8, 'num_kv_heads': 2,
         'new_decoder_architecture': True, 'num_hidden_layers': 2,
         'vocab_size': 80, 'layer_norm_epsilon': 1e-5, 'bias': False,
         'parallel_attn': True, 'alibi': False,
         'max_position_embeddings': 32}
  app, notes, a = convert(new)
  assert (app['kv_heads'], app['block_layout'], app['tied_embeddings'],
          app['linear_bias'], app['feedforward']) == \
    (2, 'parallel', True, 'none', 256)
  h, d, L, V = 64, 8, 2, 80
  block = (h * (8 + 2 * 2) * d + h * h) + 2 * h * 4 * h + 2 * 2 * h
  assert a.num_parameters() == L * block + 2 * h + V * h
  old = dict(new, new_decoder_architecture=False, multi_query=True)
  del old['num_kv_heads']
  app, notes, _ = convert(old)
  assert app['kv_heads'] == 1
  assert any('one LayerNorm' in n for n in notes)


def test_falcon_without_max_positions_needs_seq():
  cfg = {'model_type': 'falcon', 'hidden_size': 64,
         'num_attention_heads': 8, 'num_hidden_layers': 2, 'vocab_size': 80}
  with pytest.raises(ConfigError, match='--seq'):
    convert(cfg)
  assert convert(cfg, seq=2048)[0]['seq_size'] == 2048


def test_gemma_head_dim_and_tied():
  # modeling_gemma.py: head_dim from the config (q width heads x head_dim,
  # here 4 x 32 = 128 != hidden 64), GeGLU MLP, RMSNorm, tied lm_head.
  cfg = {'model_type': 'gemma', 'hidden_size': 64, 'head_dim': 32,
         'intermediate_size': 128, 'num_attention_heads': 4,
         'num_key_value_heads': 1, 'num_hidden_layers': 2,
         'vocab_size': 100, 'rms_norm_eps': 1e-6, 'hidden_act': 'gelu',
         'hidden_activation': 'gelu_pytorch_tanh',
         'max_position_embeddings': 64}
  app, _, a = convert(cfg)
  assert (app['attn_size'], app['kv_heads'], app['mlp'],
          app['tied_embeddings']) == (32, 1, 'gated', True)
  h, q, kv, L, V = 64, 128, 32, 2, 100
  block = 2 * h * q + 2 * h * kv + 3 * h * 128 + 2 * h
  assert a.num_parameters() == L * block + h + V * h == 96_832


def test_gemma2_sliding_window_every_other_block():
  """Gemma 2 attends over a 4,096-token window in its even layers
  (modeling_gemma2.py): at 8k tokens, 1 of 2 blocks windowed; at 4k the
  window covers the sequence (full attention, a note); a layer_types list
  (transformers' per-layer attention types) wins; Mistral's window holds
  in every block."""
  cfg = {'model_type': 'gemma2', 'hidden_size': 64, 'head_dim': 16,
         'intermediate_size': 128, 'num_attention_heads': 4,
         'num_key_value_heads': 2, 'num_hidden_layers': 2,
         'vocab_size': 100, 'rms_norm_eps': 1e-6, 'sliding_window': 4096,
         'max_position_embeddings': 8192, 'final_logit_softcapping': 30.0}
  app, notes, a = convert(cfg)
  assert (app['sliding_window'], app['sliding_window_blocks']) == (4096, 1)
  assert a.windowed_share == 0.5
  assert any('sliding_window 4096 in 1 of 2 blocks' in n for n in notes)
  app, notes, _ = convert(cfg, seq=4096)
  assert 'sliding_window' not in app
  assert any('post-feedforward' in n for n in notes)
  assert any('sliding_window 4096 >= seq_size' in n for n in notes)
  typed = dict(cfg, num_hidden_layers=4, layer_types=[
    'sliding_attention', 'sliding_attention', 'sliding_attention',
    'full_attention'])
  assert convert(typed)[0]['sliding_window_blocks'] == 3
  mistral = dict(LLAMA3_8B, model_type='mistral', sliding_window=4096,
                 max_position_embeddings=32768)
  app, _, _ = convert(mistral)
  assert app['sliding_window'] == 4096 and 'sliding_window_blocks' not in app
  with pytest.raises(ConfigError, match="'sliding_window' = -1"):
    convert(dict(cfg, sliding_window=-1))


def test_mistral_llama_biases():
  cfg = dict(LLAMA3_8B, model_type='mistral', attention_bias=True)
  app, notes, _ = convert(cfg)
  assert app['linear_bias'] == 'qkv' and any('output projection' in n
                                            for n in notes)
  app, _, _ = convert(dict(LLAMA3_8B, attention_bias=True, mlp_bias=True))
  assert app['linear_bias'] == 'all'


# deepseek-ai/DeepSeek-V3 and mistralai/Mixtral-8x7B-v0.1 config.json
# (the fields that shape the model).
DEEPSEEK_V3 = {
  'architectures': ['DeepseekV3ForCausalLM'], 'attention_bias': False,
  'attention_dropout': 0.0, 'first_k_dense_replace': 3, 'hidden_act': 'silu',
  'hidden_size': 7168, 'intermediate_size': 18432, 'kv_lora_rank': 512,
  'max_position_embeddings': 163840, 'model_type': 'deepseek_v3',
  'moe_intermediate_size': 2048, 'moe_layer_freq': 1, 'n_group': 8,
  'n_routed_experts': 256, 'n_shared_experts': 1, 'num_attention_heads': 128,
  'num_experts_per_tok': 8, 'num_hidden_layers': 61,
  'num_key_value_heads': 128, 'num_nextn_predict_layers': 1,
  'q_lora_rank': 1536, 'qk_nope_head_dim': 128, 'qk_rope_head_dim': 64,
  'rms_norm_eps': 1e-06, 'tie_word_embeddings': False, 'topk_group': 4,
  'topk_method': 'noaux_tc', 'v_head_dim': 128, 'vocab_size': 129280}
MIXTRAL_8X7B = {
  'architectures': ['MixtralForCausalLM'], 'attention_dropout': 0.0,
  'hidden_act': 'silu', 'hidden_size': 4096, 'intermediate_size': 14336,
  'max_position_embeddings': 32768, 'model_type': 'mixtral',
  'num_attention_heads': 32, 'num_experts_per_tok': 2,
  'num_hidden_layers': 32, 'num_key_value_heads': 8, 'num_local_experts': 8,
  'rms_norm_eps': 1e-05, 'rope_theta': 1e6, 'sliding_window': None,
  'tie_word_embeddings': False, 'vocab_size': 32000}


@pytest.mark.parametrize('cfg,bundled,seq', [
  (DEEPSEEK_V3, 'deepseek-v3', 4096), (MIXTRAL_8X7B, 'mixtral-8x7B', 32768),
  (LLAMA3_8B, 'llama3-8B', 8192)], ids=['deepseek-v3', 'mixtral', 'llama3'])
def test_official_configs_give_the_bundled_models(cfg, bundled, seq):
  from conftest import repo
  app, _, _ = convert(cfg, seq=seq)
  want = load_json(repo('models', bundled + '.json'))
  strip = lambda d: {k: v for k, v in d.items()
                     if k not in ('name', 'source', 'notes')}
  got = Application.from_dict(strip(app), 'got').to_dict()
  assert got == Application.from_dict(strip(want), bundled).to_dict()


def test_architectures_without_model_type():
  cfg = dict(LLAMA3_8B)
  del cfg['model_type']
  assert convert(cfg)[2].num_parameters() == 8_030_261_248


@pytest.mark.parametrize('content,message', [
  (dict(LLAMA3_8B, model_type='bert'),
   "field 'model_type' = \"bert\" is not allowed: calculon import-hf knows"),
  ({k: v for k, v in LLAMA3_8B.items() if k != 'hidden_size'},
   "missing field 'hidden_size'"),
  ('{"model_type": "llama",', 'not valid JSON'),
], ids=['unknown-model-type', 'missing-field', 'not-json'])
def test_bad_input_exits_2_with_one_line(tmp_path, content, message):
  config = write(tmp_path, content)
  out = tmp_path / 'app.json'
  res = run_cli('import-hf', config, str(out))
  assert res.returncode == 2
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and config in lines[0] and message in lines[0], \
    res.stderr
  assert 'Traceback' not in res.stderr and not out.exists()


def test_output_is_checked_before_work(tmp_path):
  config = write(tmp_path, LLAMA3_8B)
  (tmp_path / 'dir.json').mkdir()
  for bad, text in ((tmp_path / 'missing' / 'a.json', 'does not exist'),
                    (tmp_path / 'a.txt', r'output must be \*.json'),
                    (tmp_path / 'dir.json', 'is a folder, not a file'),
                    (config, 'overwrite the input')):
    with pytest.raises(ConfigError, match=text):
      check_output(str(bad), [config])
  check_output(str(tmp_path / 'ok.json'), [config])
