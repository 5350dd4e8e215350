// The section's small demonstrations, in its order: get_params, allreduce, split_and_load.
#include <cstdio>
#include <iostream>

#include "chapters/multi_gpu_scratch/multi_gpu_scratch.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"

namespace d2l::scratch {

void demo(const std::vector<Device>& devices) {
  // new_params = get_params(params, d2l.try_gpu(0))
  manual_seed(0);
  auto params = init_params(devices[0]);
  auto new_params = get_params(params, devices[0]);
  std::cout << "b1 weight: " << new_params[1] << "\n";
  std::cout << "b1 grad: " << new_params[1].grad() << "\n\n";

  // data = [np.ones((1, 2), ctx=d2l.try_gpu(i)) * (i + 1) for i in range(2)]
  std::vector<Device> two = devices.size() >= 2 ? std::vector<Device>{devices[0], devices[1]} : std::vector<Device>{devices[0], cpu(1)};
  std::vector<Tensor> data;
  for (size_t i = 0; i < two.size(); ++i) data.push_back(Tensor::full({1, 2}, static_cast<float>(i + 1), two[i]));
  std::cout << "before allreduce:\n" << data[0] << "\n" << data[1] << "\n";
  allreduce(data);
  std::cout << "after allreduce:\n" << data[0] << "\n" << data[1] << "\n\n";

  // data = np.arange(20).reshape(4, 5); split = gluon.utils.split_and_load(data, devices)
  std::vector<float> m(20);
  for (int i = 0; i < 20; ++i) m[i] = static_cast<float>(i);
  auto split = split_and_load(m, 4, 5, two);
  std::cout << "input:\n" << Tensor::from_vector(m, {4, 5}, two[0]) << "\n";
  std::cout << "load into " << str(two) << "\n";
  std::cout << "output:\n" << split[0] << "\n" << split[1] << "\n";
}

}  // namespace d2l::scratch
