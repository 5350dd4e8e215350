// softmax_cross_entropy: per-sample -log softmax(logits)[label] (kernels/{cpu,cuda}/softmax_ce).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/softmax_ce.cpp, kernels/cuda/softmax_ce.cu): logits (N, K), labels (N) int32
// in [0, K). loss[i] = logsumexp(logits[i]) - logits[i][label[i]], per sample;
// dlogits[i][k] = dloss[i] * (softmax(logits[i])[k] - (k == label[i])).
D2L_DECLARE_KERNEL(softmax_ce_forward, const float* logits, const int32_t* labels, float* loss, int64_t N, int64_t K);
D2L_DECLARE_KERNEL(softmax_ce_backward, const float* logits, const int32_t* labels, const float* dloss, float* dlogits,
                   int64_t N, int64_t K);

namespace d2l {
using namespace detail;

Tensor softmax_cross_entropy(const Tensor& logits_in, const Tensor& labels, Reduction r) {
  const Tensor logits = autocast_input("softmax_cross_entropy", logits_in);
  Device d = same_device("softmax_cross_entropy", {logits, labels});
  expect_f32("softmax_cross_entropy", logits, "logits");
  expect_ndim("softmax_cross_entropy", logits, 2, "logits");
  if (labels.dtype() != DType::i32 || labels.ndim() != 1 || labels.dim(0) != logits.dim(0))
    fail("softmax_cross_entropy", "labels must be int32 (N) for logits " + str(logits.shape()) + ", got " +
                                      str(labels.shape()));
  int64_t N = logits.dim(0), K = logits.dim(1);
  Tensor loss = Tensor::empty({N}, d);
  const float* L = logits.data();
  const int32_t* Y = labels.labels();
  float* out = loss.data();
  launch(d, "softmax_cross_entropy", keep({logits, labels, loss}), [=](const LaunchCtx& c) {
    // Labels in host memory (cpu, emu) are checked here; a GPU's are checked where they were made
    // (the data pipeline builds them on the host).
    for (int64_t i = 0; c.backend != Backend::gpu && i < N; ++i)
      if (Y[i] < 0 || Y[i] >= K) throw std::out_of_range("label " + std::to_string(Y[i]) + " outside [0, " + std::to_string(K) + ")");
    D2L_KERNEL(c, softmax_ce_forward, L, Y, out, N, K);
  });
  record(loss, "softmax_cross_entropy", {logits, labels}, [logits, labels, N, K](const Tensor& gy) {
    Tensor gx = Tensor::empty(logits.shape(), logits.device());
    const float *L = logits.data(), *G = gy.data();
    const int32_t* Y = labels.labels();
    float* GX = gx.data();
    launch(logits.device(), "softmax_cross_entropy_backward", keep({logits, labels, gy, gx}),
           [=](const LaunchCtx& c) { D2L_KERNEL(c, softmax_ce_backward, L, Y, G, GX, N, K); });
    return std::vector<Tensor>{gx, Tensor()};
  });
  return reduce_loss(loss, r);
}

}  // namespace d2l
