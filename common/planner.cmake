# shardtrain_planner: the pure planner (spec, world) -> v1::Plan. No I/O,
# threads or RPC; the model's shape and layout come from shardtrain_model_spec.
add_library(shardtrain_planner STATIC ${CMAKE_SOURCE_DIR}/common/planner.cc
                                      ${CMAKE_SOURCE_DIR}/common/planner_sizes.cc
                                      ${CMAKE_SOURCE_DIR}/common/planner_state.cc
                                      ${CMAKE_SOURCE_DIR}/common/planner_text.cc
                                      ${CMAKE_SOURCE_DIR}/common/planner_finetune.cc
                                      ${CMAKE_SOURCE_DIR}/common/auto_layout.cc)
target_link_libraries(shardtrain_planner PUBLIC
  shardtrain_common
  shardtrain_model_spec
  shardtrain_proto
  absl::status
  absl::statusor
  absl::strings
  absl::str_format
)
