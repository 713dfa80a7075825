#include "kernels/ops.h"

namespace tandem {

size_t kv_dtype_size(KvDType dtype) { return dtype == KvDType::F32 ? 4 : 2; }
std::string_view kv_dtype_name(KvDType dtype) { return dtype == KvDType::F32 ? "f32" : "bf16"; }

}  // namespace tandem
