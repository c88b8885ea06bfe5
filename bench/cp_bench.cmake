# cp_bench: context parallelism on long sequences (8192, 16384 tokens) over
# cp 1, 2, 4 (forked processes, Gloo): step time, activation bytes per rank
# and ring bytes sent, each beside the plan's and as ratios. Not a test.
if(TARGET shardtrain_worker_core)
  add_executable(cp_bench ${CMAKE_CURRENT_LIST_DIR}/cp_bench.cc)
  target_link_libraries(cp_bench PRIVATE shardtrain_worker_core shardtrain_planner CLI11::CLI11)
endif()
