/* Kernels written once for several storage types: a source defines TYPE_SUFFIX (f32, bf16, bf16w) and includes
   the typed header, once per type; inside it SFX(name) is name_<suffix> (mk_1 -> mk_1_f32), so every type gets
   its own copy of each function, with the types and loads of that suffix (SFX(WT), SFX(LOADW), ...). */
#ifndef SWITCHYARD_TYPE_SUFFIX_H
#define SWITCHYARD_TYPE_SUFFIX_H
#define SFX_PASTE_(name, suffix) name##_##suffix
#define SFX_PASTE(name, suffix) SFX_PASTE_(name, suffix)
#define SFX(name) SFX_PASTE(name, TYPE_SUFFIX)
/* A second type in the same kernels (the KV cache's, in paged_attention_typed.h): CFX(name) is name_<CACHE_SUFFIX>. */
#define CFX(name) SFX_PASTE(name, CACHE_SUFFIX)
#endif
