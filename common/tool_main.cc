#include "common/tool_main.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include "common/transport.h"

namespace asyncps {

void InitTool(const char* usage, int* argc, char*** argv,
              const ToolOptions& options) {
  gflags::SetUsageMessage(usage);
  gflags::ParseCommandLineFlags(argc, argv, true);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging((*argv)[0]);
  if (options.tune_allocator_for_messages) (void)TuneAllocatorForMessages();
}

}  // namespace asyncps
