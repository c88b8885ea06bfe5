# collective_bench: Gloo collectives on loopback vs memcpy (a benchmark, not a test).
if(TARGET shardtrain_comm)
  add_executable(collective_bench ${CMAKE_CURRENT_LIST_DIR}/collective_bench.cc)
  target_link_libraries(collective_bench PRIVATE shardtrain_comm Threads::Threads)
endif()
