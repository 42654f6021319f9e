"""Names of the calculon layers (calculon/llm/block.py) that the PyTorch
block of :mod:`calculon.profile.gpt` runs as modules (no torch import)."""

#: The layers of calculon/llm/block.py that have a module here, in order.
ATTN_LAYERS = ('AttnBlock_LayerNorm', 'AttnBlock_Query', 'AttnBlock_Key',
               'AttnBlock_Value', 'AttnBlock_Multihead_Key_Query',
               'AttnBlock_Multihead_SoftMax', 'AttnBlock_Multihead_DropOut',
               'AttnBlock_Multihead_Attn', 'AttnBlock_MLP',
               'AttnBlock_DropOut', 'AttnBlock_Residual')
MLP_LAYERS = ('MlpBlock_LayerNorm', 'MlpBlock_Mlp1', 'MlpBlock_GeLU',
              'MlpBlock_Mlp2', 'MlpBlock_DropOut', 'MlpBlock_Residual')
LAYERS = ATTN_LAYERS + MLP_LAYERS
#: Layers calculon prices on the matrix engine (GEMMs).
GEMM_LAYERS = ('AttnBlock_Query', 'AttnBlock_Key', 'AttnBlock_Value',
               'AttnBlock_Multihead_Key_Query', 'AttnBlock_Multihead_Attn',
               'AttnBlock_MLP', 'MlpBlock_Mlp1', 'MlpBlock_Mlp2')
