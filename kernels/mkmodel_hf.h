/* SPDX-License-Identifier: MIT */
/*
 * kernels/mkmodel_hf.h — ringlm-mkmodel's --from-hf entry point (a Hugging Face checkpoint
 * directory imported as GGUF by model/hf_import.h), kept apart from the synthetic-model
 * writer in main_ringlm-mkmodel.c.
 */
#ifndef RINGLM_KERNELS_MKMODEL_HF_H
#define RINGLM_KERNELS_MKMODEL_HF_H

#include <stdbool.h>

/* True when the command line asks for an import (names --from-hf). */
bool mkmodel_wants_hf(int argc, char **argv);
/* ringlm-mkmodel --from-hf DIR --out FILE [--type F32|F16|BF16]: returns the exit status. */
int mkmodel_from_hf(int argc, char **argv);

#endif
