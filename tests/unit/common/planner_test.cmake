# Unit tests of the pure planner (common/planner.h).
add_executable(planner_test ${CMAKE_CURRENT_LIST_DIR}/planner_test.cc
                            ${CMAKE_CURRENT_LIST_DIR}/planner_memory_test.cc)
target_link_libraries(planner_test PRIVATE shardtrain_planner GTest::gtest_main)
target_compile_definitions(planner_test PRIVATE SHARDTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(planner_test PROPERTIES LABELS "unit")
