// cast's loop (cast.cpp), compiled once per instruction set (per_isa.hpp): every element converted
// by f, a template argument, so that it is inlined into the loop (a call per element through a
// pointer cost a fifth of a bfloat16 training step) and the loop vectorises.
template <auto f, class From, class To>
void convert(const Ctx& c, const From* x, To* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
}
