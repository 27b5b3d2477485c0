import torch

from mtx.config import ModelConfig

torch.set_num_threads(2)


def tiny_model_config(**overrides) -> ModelConfig:
    values = dict(d_model=32, d_ff=64, n_heads=4, encoder_layers=2, decoder_layers=2, dropout=0.0)
    values.update(overrides)
    return ModelConfig(**values)
