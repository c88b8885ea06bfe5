# Unit tests of the pure planner (common/planner.h).
add_executable(planner_test ${CMAKE_CURRENT_LIST_DIR}/planner_test.cc
                            ${CMAKE_CURRENT_LIST_DIR}/planner_memory_test.cc)
target_link_libraries(planner_test PRIVATE shardtrain_planner GTest::gtest_main)
target_compile_definitions(planner_test PRIVATE SHARDTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(planner_test PROPERTIES LABELS "unit")

# The --auto layout search (common/auto_layout.h).
add_executable(auto_layout_test ${CMAKE_CURRENT_LIST_DIR}/auto_layout_test.cc)
target_link_libraries(auto_layout_test PRIVATE shardtrain_planner GTest::gtest_main)
target_compile_definitions(auto_layout_test PRIVATE SHARDTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
gtest_discover_tests(auto_layout_test PROPERTIES LABELS "unit")
