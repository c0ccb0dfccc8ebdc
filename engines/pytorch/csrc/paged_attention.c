/* Attention over the paged KV cache in place (engines/pytorch/paged_attention.py): decode rows (one query per
   sequence) and prefill chunks (causal), rope and the cache writes included, with their entry points on the
   helper-thread pool. Built by native.py. Three pairs of types: float32 throughout (_f32), bfloat16 throughout
   (_bf16), and float32 activations over a bfloat16 cache (_f32_kvbf16: `kv_cache.dtype: bfloat16` of a float32
   model). */
#include "paged_attention_common.h"
#include "pool_client.h"
#include "spin_wait.h"
#include "type_suffix.h"

#define TYPE_SUFFIX f32
#define CACHE_SUFFIX f32
#include "paged_attention_typed.h"
#undef TYPE_SUFFIX
#undef CACHE_SUFFIX
#define TYPE_SUFFIX bf16
#define CACHE_SUFFIX bf16
#include "paged_attention_typed.h"
#undef TYPE_SUFFIX
#undef CACHE_SUFFIX
/* the activations' helpers of the mixed pair are float32's */
typedef float T_f32_kvbf16;
#define load1_f32_kvbf16 load1_f32
#define store1_f32_kvbf16 store1_f32
#define rope_f32_kvbf16 rope_f32
#define roundz_f32_kvbf16 roundz_f32
#define TYPE_SUFFIX f32_kvbf16
#define CACHE_SUFFIX bf16
#include "paged_attention_typed.h"
#undef TYPE_SUFFIX
#undef CACHE_SUFFIX
