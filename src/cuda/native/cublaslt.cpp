// cuda/native/cublaslt.cpp — Matmul (cuda/gemm.h) on cuBLASLt.
//
// Determinism: an algorithm is chosen once per call shape — ops, m, n, k, types, leading dimensions, bias,
// and the alignment of each pointer (cuBLASLt's heuristic assumes 256-byte alignment unless told) — and
// cached, so the same shape always runs the same kernel with the same reduction order. The heuristic is
// restricted to reductions without atomics: no split-K, or split-K reduced in the workspace
// (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE / OUTPUT_TYPE); INPLACE (atomic) is excluded. Compute type
// CUBLAS_COMPUTE_32F: f32 accumulation, and f32 inputs are never rounded to TF32.
#include <map>
#include <tuple>

#include "cuda/gemm.h"
#include "cuda/native/cuda_check.h"

namespace lt::cuda::native {
namespace {

cudaDataType_t data_type(MatType t) { return t == MatType::f32 ? CUDA_R_32F : CUDA_R_16BF; }
cublasOperation_t operation(MatOp op) { return op == MatOp::N ? CUBLAS_OP_N : CUBLAS_OP_T; }

// The largest power of two ≤ 256 dividing the address (0 counts as 256).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t, bool, uint32_t,
                       uint32_t, uint32_t, uint32_t>;

Key key_of(const Matmul& mm) {
  return {int(mm.op_a), int(mm.op_b), mm.m, mm.n, mm.k, int(mm.a_type), int(mm.b_type), int(mm.d_type), mm.lda,
          mm.ldb, mm.ldd, mm.bias != nullptr, alignment(mm.A), alignment(mm.B), alignment(mm.D),
          mm.bias ? alignment(mm.bias) : 256u};
}

// RAII for cuBLASLt's descriptors.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~Descriptors() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void describe_call(Descriptors& ds, const Matmul& mm) {
  const std::string what = describe(mm);
  LT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "{}: descriptor", what);
  const cublasOperation_t ta = operation(mm.op_a), tb = operation(mm.op_b);
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "{}", what);
  LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "{}", what);
  if (mm.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
                    "{}: bias epilogue", what);
    LT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &mm.bias,
                                                   sizeof(mm.bias)),
                    "{}: bias pointer", what);
  }
  // Layouts as stored (column-major rows × cols, leading dimension).
  const int64_t a_rows = mm.op_a == MatOp::N ? mm.m : mm.k, a_cols = mm.op_a == MatOp::N ? mm.k : mm.m;
  const int64_t b_rows = mm.op_b == MatOp::N ? mm.k : mm.n, b_cols = mm.op_b == MatOp::N ? mm.n : mm.k;
  LT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.a, data_type(mm.a_type), uint64_t(a_rows), uint64_t(a_cols), mm.lda),
                  "{}: layout of A", what);
  LT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.b, data_type(mm.b_type), uint64_t(b_rows), uint64_t(b_cols), mm.ldb),
                  "{}: layout of B", what);
  LT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ds.d, data_type(mm.d_type), uint64_t(mm.m), uint64_t(mm.n), mm.ldd),
                  "{}: layout of D", what);
}

}  // namespace

struct CublasLt::State {
  cublasLtHandle_t handle = nullptr;
  size_t workspace_bytes = 0;
  std::map<Key, cublasLtMatmulAlgo_t> algorithms;
};

CublasLt::CublasLt(size_t workspace_bytes) : state_(std::make_unique<State>()) {
  state_->workspace_bytes = workspace_bytes;
  LT_CUBLAS_CHECK(cublasLtCreate(&state_->handle), "creating the cuBLASLt handle");
}

CublasLt::~CublasLt() {
  if (state_ && state_->handle) cublasLtDestroy(state_->handle);
}

size_t CublasLt::workspace_bytes() const { return state_->workspace_bytes; }

void CublasLt::run(const Matmul& mm, Stream stream, void* workspace) {
  check(mm);
  Descriptors ds;
  describe_call(ds, mm);
  const Key key = key_of(mm);
  auto found = state_->algorithms.find(key);
  if (found == state_->algorithms.end()) {
    cublasLtMatmulPreference_t pref = nullptr;
    LT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), "{}: preference", describe(mm));
    struct PrefGuard {
      cublasLtMatmulPreference_t p;
      ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
    } guard{pref};
    const uint64_t ws = state_->workspace_bytes;
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;  // never INPLACE (atomics)
    const uint32_t align_a = alignment(mm.A), align_b = alignment(mm.B), align_d = alignment(mm.D);
    auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, const auto& value) {
      LT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
                      "{}: preference {}", describe(mm), int(attribute));
    };
    prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    prefer(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d);
    prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d);
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    LT_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(state_->handle, ds.op, ds.a, ds.b, ds.d, ds.d, pref, 1, &result,
                                                   &count),
                    "{}: choosing an algorithm", describe(mm));
    LT_CHECK(count > 0, "{}: cuBLASLt has no algorithm for this call within {} bytes of workspace", describe(mm), ws);
    found = state_->algorithms.emplace(key, result.algo).first;
  }
  LT_CUBLAS_CHECK(cublasLtMatmul(state_->handle, ds.op, &mm.alpha, mm.A, ds.a, mm.B, ds.b, &mm.beta, mm.D, ds.d, mm.D,
                                 ds.d, &found->second, workspace, state_->workspace_bytes,
                                 static_cast<cudaStream_t>(stream)),
                  "{}", describe(mm));
}

}  // namespace lt::cuda::native
