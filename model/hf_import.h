/* SPDX-License-Identifier: MIT */
/*
 * model/hf_import.h — a Hugging Face checkpoint directory as a GGUF file with the tensor
 * names, layouts and metadata llama.cpp's convert_hf_to_gguf.py writes (ringlm-mkmodel
 * --from-hf DIR):
 *
 *   config.json             architectures[0]: LlamaForCausalLM, MistralForCausalLM,
 *                           Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
 *                           Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, and
 *                           Gemma3ForConditionalGeneration's language model (text_config,
 *                           Gemma3TextConfig's defaults for what it leaves out; the vision
 *                           tower and projector are not imported)
 *   *.safetensors           one file or shards named by model.safetensors.index.json
 *                           (model/safetensors.h); F32, F16 and BF16 tensors
 *   tokenizer.json          the vocabulary (gw_vocab_from_hf: byte-level BPE or
 *                           SentencePiece-like BPE); where there is none, or where the
 *                           converter reads the other first (every architecture but
 *                           qwen3moe, and phi3 whose tokenizer_class is GPT2Tokenizer),
 *   tokenizer.model         SentencePiece's model (gw_vocab_from_spm, model/spm_proto.h)
 *                           with added_tokens.json
 *   tokenizer_config.json   special tokens, add_bos/add_eos/add_sep (with tokenizer.json's
 *                           post-processor and config.json's *_token_id, as the
 *                           converter's SpecialVocab) and the chat template (or
 *                           chat_template.jinja)
 *
 * As the converter: llama's Q and K rows permuted from Hugging Face's halves to the
 * adjacent pairs of GGUF's "llama" RoPE; gemma's norms stored as w - 1 written as w; phi3's
 * fused qkv_proj and gate_up_proj kept fused; qwen3moe's experts stacked into 3-D tensors;
 * Llama 3.x RoPE scaling (rope_type "llama3") written as the rope_freqs.weight tensor, linear
 * and YaRN scaling as rope.scaling.* keys, Phi-3's long-RoPE as rope_factors_{long,short}.
 * Matrices keep the checkpoint's dtype unless a type is asked; norms, biases and the MoE
 * router are written F32.
 *
 * Every tensor's shape is checked against config.json, every tensor the architecture needs
 * must be there and every tensor there must be used: each refusal names the file and the
 * tensor (or the config key).
 *
 * Errors: 0 or a negative errno with gw_errmsg() (model/gguf_write.h) set.
 */
#ifndef RINGLM_MODEL_HF_IMPORT_H
#define RINGLM_MODEL_HF_IMPORT_H

#include <stddef.h>

typedef struct hf_import_opts {
    const char *type; /* matrices written as "F32", "F16" or "BF16"; NULL: as stored */
} hf_import_opts;

/* Imports the checkpoint in dir into the GGUF file out. note (may be NULL) receives one line
 * on what was done ("llama, 16 layers, BF16 matrices, Llama 3 RoPE factors"). */
int hf_import(const char *dir, const char *out, const hf_import_opts *o, char *note,
              size_t note_len);

#endif
