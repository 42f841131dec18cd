// ATen's CPU kernel set, as `torch.backends.cpu.get_cpu_capability()` prints it ("AVX2",
// "AVX512", "DEFAULT", ...): the widest the CPU has unless ATEN_CPU_CAPABILITY lowers it. AVX2 and
// AVX-512 kernels round differently, so a run's numbers depend on it; tch binds no call for it.
// Only a declaration is needed: the function lives in libtorch_cpu, which tch links.
#include <cstring>
#include <string>

namespace at {
std::string get_cpu_capability();
}

// Writes the name, NUL-terminated, into `out` (`size` bytes); 0 on success.
extern "C" int rr_cpu_capability(char* out, int size) {
  if (size <= 0) return 1;
  try {
    std::string name = at::get_cpu_capability();
    std::strncpy(out, name.c_str(), size - 1);
    out[size - 1] = 0;
    return 0;
  } catch (...) {
    return 1;
  }
}
