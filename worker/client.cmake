# The parameter-server client library and the ps_worker binary.
add_library(asyncps_client client.cc
  # The Client implementation (worker/client/): its core (start, wait,
  # pump) and the types over it.
  client/core.cc client/transfers.cc client/pull_reader.cc
  client/shm_pulls.cc client/elastic_router.cc client/admin.cc
  client/uploads.cc client/heartbeater.cc
  upload.cc ps_store.cc evaluator.cc overlap.cc internal/rows_plan.cc)
add_library(asyncps::client ALIAS asyncps_client)
target_include_directories(asyncps_client PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(asyncps_client
  PUBLIC asyncps::common
  PRIVATE asyncps::compression asyncps::worker asyncps::etcd glog::glog
          nlohmann_json::nlohmann_json asyncps_warnings)

add_executable(ps_worker main.cc)
target_link_libraries(ps_worker PRIVATE asyncps::client asyncps::tool_main asyncps::worker asyncps::etcd_flags asyncps::compression
  asyncps::metrics_flags asyncps::curve_flags
  gflags glog::glog nlohmann_json::nlohmann_json asyncps_warnings)

asyncps_add_test(client_test
  SOURCES client_test.cc client/parts_test.cc
  LIBS asyncps::client asyncps::compression glog::glog
  TIMEOUT 120)

asyncps_add_test(rows_plan_test
  SOURCES internal/rows_plan_test.cc
  LIBS asyncps::client)
