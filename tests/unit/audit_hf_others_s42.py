"""Tiny transformers encoder, encoder-decoder, vision and speech models (random weights, no hub)
for test_audit_s42_hf_others.py, and census factories (`module:callable`) for `tunedb census`.

BUILD[name](attn) -> model; INPUTS[name](batch) -> the forward's keyword inputs. A name whose
transformers class is missing is absent from AVAILABLE (the test skips it)."""
from __future__ import annotations

from typing import Any, Callable

import torch

try:
    import transformers as T
except ImportError:  # pragma: no cover - the tests importorskip transformers first
    T = None

V = 99  # vocabulary
TXT = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
           max_position_embeddings=64)
S2S = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
           decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
           pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
T5 = dict(vocab_size=V, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, decoder_start_token_id=0,
          pad_token_id=0, eos_token_id=1)
VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
           intermediate_size=37)
W2V = dict(vocab_size=12, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
           conv_dim=(8, 8), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=8,
           num_conv_pos_embedding_groups=2, mask_time_prob=0.0, layerdrop=0.0)
WHISPER = dict(vocab_size=V, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2,
               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37,
               max_source_positions=30, max_target_positions=64, pad_token_id=1, bos_token_id=0, eos_token_id=3,
               decoder_start_token_id=2, suppress_tokens=None, begin_suppress_tokens=None)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def ids(b: int = 2, s: int = 7, seed: int = 3) -> torch.Tensor:
    return torch.randint(4, V, (b, s), generator=_gen(seed))


def text(b: int = 2) -> dict[str, torch.Tensor]:
    x = ids(b)
    mask = torch.ones_like(x)
    mask[-1, -2:] = 0  # a padded row: the attention mask path
    return {"input_ids": x, "attention_mask": mask}


def seq2seq(b: int = 2) -> dict[str, torch.Tensor]:
    return {**text(b), "decoder_input_ids": ids(b, 4, seed=8)}


def image(b: int = 2) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(b, 3, 32, 32, generator=_gen(4))}


def wave(b: int = 2) -> dict[str, torch.Tensor]:
    return {"input_values": torch.randn(b, 800, generator=_gen(6))}


def mel(b: int = 2) -> dict[str, torch.Tensor]:
    return {"input_features": torch.randn(b, 16, 60, generator=_gen(5)), "decoder_input_ids": ids(b, 3, seed=9)}


def _cfg(cls_name: str, **kw: Any) -> Any:
    return getattr(T, cls_name)(**kw)


def _m(model_cls: str, cfg_cls: str, base: dict, **kw: Any) -> Callable[[str], Any]:
    def build(attn: str) -> Any:
        return getattr(T, model_cls)(_cfg(cfg_cls, **{**base, **kw}, attn_implementation=attn))
    build.classes = (model_cls, cfg_cls)  # type: ignore[attr-defined]
    return build


# name: (builder, inputs, supports sdpa)
MODELS: dict[str, tuple[Callable[[str], Any], Callable[[int], dict], bool]] = {
    "bert-seqcls": (_m("BertForSequenceClassification", "BertConfig", TXT, num_labels=3), text, True),
    "bert-mlm": (_m("BertForMaskedLM", "BertConfig", TXT), text, True),
    "roberta-tokcls": (_m("RobertaForTokenClassification", "RobertaConfig", TXT, num_labels=5), text, True),
    "distilbert": (_m("DistilBertForSequenceClassification", "DistilBertConfig",
                      dict(vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=64)),
                   text, True),
    "albert": (_m("AlbertForMaskedLM", "AlbertConfig", TXT, embedding_size=16), text, True),
    "electra": (_m("ElectraForTokenClassification", "ElectraConfig", TXT, embedding_size=16), text, True),
    "deberta": (_m("DebertaForTokenClassification", "DebertaConfig", TXT, relative_attention=True,
                   pos_att_type=["p2c", "c2p"]), text, False),
    "deberta-v2": (_m("DebertaV2ForSequenceClassification", "DebertaV2Config", TXT, num_labels=2,
                      relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"]), text, False),
    "longformer": (_m("LongformerForSequenceClassification", "LongformerConfig",
                      {**TXT, "max_position_embeddings": 80}, attention_window=4),
                   lambda b=2: {"input_ids": ids(b, 8)}, False),
    "modernbert": (_m("ModernBertForMaskedLM", "ModernBertConfig", TXT, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2,
                      local_attention=8), text, True),
    "bart": (_m("BartForConditionalGeneration", "BartConfig", S2S), seq2seq, True),
    "mbart": (_m("MBartForConditionalGeneration", "MBartConfig", S2S), seq2seq, True),
    "pegasus": (_m("PegasusForConditionalGeneration", "PegasusConfig", S2S), seq2seq, True),
    "marian": (_m("MarianMTModel", "MarianConfig", S2S), seq2seq, True),
    "t5": (_m("T5ForConditionalGeneration", "T5Config", T5), seq2seq, True),
    "t5-gated": (_m("T5ForConditionalGeneration", "T5Config", T5, feed_forward_proj="gated-gelu"), seq2seq, True),
    "vit": (_m("ViTForImageClassification", "ViTConfig", VIT, num_labels=3), image, True),
    "deit": (_m("DeiTForImageClassificationWithTeacher", "DeiTConfig", VIT, num_labels=3), image, True),
    "swin": (_m("SwinForImageClassification", "SwinConfig",
                dict(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
                     num_labels=3)), image, False),
    "convnext": (_m("ConvNextForImageClassification", "ConvNextConfig",
                    dict(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=3)), image, False),
    "resnet": (_m("ResNetForImageClassification", "ResNetConfig",
                  dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck",
                       num_labels=3)), image, False),
    "clip": (_m("CLIPModel", "CLIPConfig", dict(text_config=TXT, vision_config=VIT, projection_dim=16)),
             lambda b=2: {**text(b), **image(b)}, True),
    "siglip": (_m("SiglipModel", "SiglipConfig", dict(text_config=TXT, vision_config=VIT)),
               lambda b=2: {"input_ids": ids(b), **image(b)}, True),
    "whisper": (_m("WhisperForConditionalGeneration", "WhisperConfig", WHISPER), mel, True),
    "wav2vec2-ctc": (_m("Wav2Vec2ForCTC", "Wav2Vec2Config", W2V), wave, True),
    "wav2vec2-ctc-layernorm": (_m("Wav2Vec2ForCTC", "Wav2Vec2Config", W2V, feat_extract_norm="layer",
                                  do_stable_layer_norm=True), wave, True),
    "hubert-ctc": (_m("HubertForCTC", "HubertConfig", W2V), wave, True),
    "w2v-conformer": (_m("Wav2Vec2ConformerForCTC", "Wav2Vec2ConformerConfig", W2V, conv_depthwise_kernel_size=3,
                         position_embeddings_type="relative"), wave, False),
    "speech2text": (_m("Speech2TextForConditionalGeneration", "Speech2TextConfig",
                       {**S2S, "input_feat_per_channel": 16, "num_conv_layers": 2, "conv_channels": 16,
                        "conv_kernel_sizes": [5, 5], "max_source_positions": 64, "max_target_positions": 64}),
                    lambda b=2: {"input_features": torch.randn(b, 40, 16, generator=_gen(7)),
                                 "decoder_input_ids": ids(b, 3, seed=9)}, False),
}


def available(name: str) -> bool:
    if T is None:
        return False
    model_cls, cfg_cls = MODELS[name][0].classes  # type: ignore[attr-defined]
    return hasattr(T, model_cls) and hasattr(T, cfg_cls)


def build(name: str, attn: str = "sdpa", dtype: torch.dtype = torch.float32) -> Any:
    make, _inputs, sdpa = MODELS[name]
    torch.manual_seed(0)
    return make(attn if sdpa else "eager").to(dtype).eval()


def inputs(name: str, dtype: torch.dtype = torch.float32, batch: int = 2) -> dict[str, torch.Tensor]:
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in MODELS[name][1](batch).items()}


# --- census factories: `tunedb census audit_hf_others_s42:census_whisper --device meta ...` ----------

def census_whisper(device: Any = "meta") -> tuple[Any, Callable[[int, int], tuple]]:
    """Whisper as a census workload (encoder + one decoder position), bf16."""
    with torch.device(device):
        model = build("whisper", dtype=torch.bfloat16)

    def make_inputs(batch: int, length: int) -> tuple:
        feats = torch.zeros(batch, 16, 60, dtype=torch.bfloat16, device=device)
        return (feats, None, torch.full((batch, 1), 2, dtype=torch.long, device=device))
    return model, make_inputs


def census_vit(device: Any = "meta") -> tuple[Any, Callable[[int, int], tuple]]:
    with torch.device(device):
        model = build("vit", dtype=torch.bfloat16)
    return model, lambda batch, length: (torch.zeros(batch, 3, 32, 32, dtype=torch.bfloat16, device=device),)


def census_bert(device: Any = "meta") -> tuple[Any, Callable[[int, int], tuple]]:
    """BERT with an attention mask: transformers reads the mask's values (meta tensors hold none)."""
    with torch.device(device):
        model = build("bert-seqcls", dtype=torch.bfloat16)

    def make_inputs(batch: int, length: int) -> tuple:
        x = torch.ones(batch, min(length, 64), dtype=torch.long, device=device)
        return (x, torch.ones_like(x))
    return model, make_inputs
