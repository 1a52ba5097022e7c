#include "amx_tiles.h"

#if defined(PAGEDLLM_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pagedllm {

bool amx_tiles_granted() {
#if defined(PAGEDLLM_AMX)
  // Linux hands out the tile state only to a process that asks for it (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
  static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return granted;
#else
  return false;
#endif
}

}  // namespace pagedllm
