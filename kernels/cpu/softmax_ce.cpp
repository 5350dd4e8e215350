// softmax cross-entropy, logits (N, K), labels (N) in [0, K):
// loss[i] = logsumexp(logits[i]) - logits[i][label[i]];
// backward: dlogits[i][k] = dloss[i] * (softmax(logits[i])[k] - (k == label[i])).
#include <cmath>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

// Stable log-sum-exp pieces of one row: m = max, s = sum exp(x - m) (in double, every term <= 1).
static void row_max_sumexp(const float* x, int64_t K, double& m, double& s) {
  m = x[0];
  for (int64_t k = 1; k < K; ++k) m = x[k] > m ? x[k] : m;
  s = 0.0;
  for (int64_t k = 0; k < K; ++k) s += std::exp(x[k] - m);
}

void softmax_ce_forward(const Ctx& c, const float* logits, const int32_t* labels, float* loss, int64_t N,
                        int64_t K) {
  c.parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* x = logits + i * K;
      double m, s;
      row_max_sumexp(x, K, m, s);
      loss[i] = static_cast<float>(m + std::log(s) - x[labels[i]]);
    }
  });
}

void softmax_ce_backward(const Ctx& c, const float* logits, const int32_t* labels, const float* dloss,
                         float* dlogits, int64_t N, int64_t K) {
  c.parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float* x = logits + i * K;
      float* dx = dlogits + i * K;
      double m, s;
      row_max_sumexp(x, K, m, s);
      for (int64_t k = 0; k < K; ++k) {
        const double p = std::exp(x[k] - m) / s;
        dx[k] = static_cast<float>(dloss[i] * (p - (k == labels[i] ? 1.0 : 0.0)));
      }
    }
  });
}

}  // namespace d2l::kernels::cpu
