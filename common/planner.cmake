# shardtrain_planner: the pure planner (spec, world) -> v1::Plan. No I/O,
# threads or RPC. It compiles the GPT parameter layout and config sources in
# directly instead of linking shardtrain_engine, which would drag in OpenBLAS.
add_library(shardtrain_planner STATIC
  ${CMAKE_SOURCE_DIR}/common/planner.cc
  ${CMAKE_SOURCE_DIR}/worker/model/param_layout.cc
  ${CMAKE_SOURCE_DIR}/worker/model/config.cc
)
target_link_libraries(shardtrain_planner PUBLIC
  shardtrain_common
  shardtrain_proto
  absl::status
  absl::statusor
  absl::strings
  absl::str_format
)
