"""Human-readable reports of a run (reads statistics only, never the model).
"""

from calculon.units import human_format


def text_report(app, exe, system, stats):
  """A readable, unit-labelled summary of one run's statistics.

  Args:
    app: Application config; exe: Execution config; system: System;
    stats: dict of statistics (Calculon names).
  """
  def t(name):
    return f'{stats[name]:.4f} s'

  def b(name):
    value = stats[name]
    return 'n/a' if value is None else human_format(value, 'bytes')

  def bw(name):
    return human_format(stats[name], 'bandwidth')

  lines = [
    '=' * 72,
    f'Model: {app.num_blocks} blocks, hidden {app.hidden}, feedforward '
    f'{app.feedforward}, {app.attn_heads} heads x {app.attn_size}, sequence '
    f'{app.seq_size} ({human_format(app.num_parameters())} parameters)',
    f'Run: {exe.num_procs} processors, TP={exe.tensor_par} '
    f'PP={exe.pipeline_par} DP={exe.data_par}, batch {exe.batch_size}, '
    f'microbatch {exe.microbatch_size}, {exe.datatype}, '
    f"{'training' if exe.training else 'inference'}",
    '',
    'Time per batch',
    f'  forward            {t("fw_time")}',
    f'  backward           {t("bw_time")}',
    f'  optimizer step     {t("optim_step_time")}',
    f'  recompute          {t("recompute_time")}',
    f'  recomm (exposed)   {t("recomm_exposed_time")}',
    f'  pipeline bubble    {t("bubble_time")}',
    f'  TP comm (exposed)  {t("tp_comm_exposed_time")}   '
    f'(on link {t("tp_comm_link_time")})',
    f'  PP comm (exposed)  {t("pp_comm_exposed_time")}   '
    f'(on link {t("pp_comm_link_time")})',
    f'  DP comm (exposed)  {t("dp_comm_exposed_time")}   '
    f'(on link {t("dp_comm_link_time")})',
    f'  FW offload (exp.)  {t("fw_offload_exposed_time")}',
    f'  BW offload (exp.)  {t("bw_offload_exposed_time")}',
    f'  total              {t("total_time")}',
    '',
    'Memory per processor',
    f'  weights            {b("weight_space")}',
    f'  activations        {b("act_space")}',
    f'  act. checkpoints   {b("act_checkpoint_size")}',
    f'  act. gradients     {b("act_grad_space")}',
    f'  weight gradients   {b("weight_grad_space")}',
    f'  optimizer state    {b("optimizer_space")}',
    f'  tier 1 needed      {b("proc_mem_tier1_cap_req")} of '
    f'{human_format(system.mem1.capacity_bytes, "bytes")}',
    f'  tier 2 needed      {b("proc_mem_tier2_cap_req")} of '
    f'{human_format(system.mem2.capacity_bytes, "bytes")}',
    '',
    'Bandwidth needed',
    f'  offload (tier 2)   {bw("offload_mem_bw_req")}',
    f'  TP overlap         {bw("tp_bw_overlap_req")}',
    '',
    'Efficiency',
    f'  compute            {stats["compute_efficiency"] * 100:.2f} %',
    f'  system             {stats["system_efficiency"] * 100:.2f} %',
    f'  total              {stats["total_efficiency"] * 100:.2f} %',
    f'  sample rate        {stats["sample_rate"]:.2f} samples/s',
  ]
  return '\n'.join(lines)
