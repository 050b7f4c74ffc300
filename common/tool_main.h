// What every asyncps command-line binary (ps_server, ps_ctl, ps_worker,
// ps_reshard, ps_train_local, ps_ctr_worker, ps_criteo_gen) does first, in
// one place: its usage line, gflags parsed (and removed from argv), glog to
// stderr under the binary's name, and for the binaries that move tensors
// the allocator tuned for ZeroMQ's messages (common/transport.h).
// Libraries never read flags: only a main() calls this.
//
// Thread safety: call once, from main(), before any other thread starts.
#pragma once

namespace asyncps {

struct ToolOptions {
  // TuneAllocatorForMessages() (received chunks are malloc'd by ZeroMQ:
  // keep their memory mapped). Default: false.
  bool tune_allocator_for_messages = false;
};

void InitTool(const char* usage, int* argc, char*** argv,
              const ToolOptions& options = {});

}  // namespace asyncps
