# recompute_bench: model.recompute none / selective / full and tp2 with and
# without parallel.sequence_parallel (forked processes, Gloo): step time,
# activation bytes and tp bytes sent, as ratios. Not a test.
if(TARGET shardtrain_worker_core)
  add_executable(recompute_bench ${CMAKE_CURRENT_LIST_DIR}/recompute_bench.cc)
  target_link_libraries(recompute_bench PRIVATE shardtrain_worker_core shardtrain_planner
                        CLI11::CLI11)
endif()
