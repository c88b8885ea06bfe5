# shardtrain_version: kVersion and kGitRevision (common/version.h). The
# revision is read by common/write_version.cmake on every build; the generated
# file is rewritten only when its text changes, so an unchanged revision
# rebuilds nothing and a new one recompiles one file and relinks.
set(SHARDTRAIN_VERSION_CC ${CMAKE_BINARY_DIR}/generated/shardtrain_version.cc)
# The commit, when the sources are not a git checkout (an image build).
set(SHARDTRAIN_GIT_REVISION "" CACHE STRING
    "git revision to report when the source tree has no .git (empty: ask git)")
add_custom_target(shardtrain_version_gen
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DOUT=${SHARDTRAIN_VERSION_CC}
          -DVERSION=${PROJECT_VERSION} -DREVISION=${SHARDTRAIN_GIT_REVISION} -P ${CMAKE_CURRENT_LIST_DIR}/write_version.cmake
  BYPRODUCTS ${SHARDTRAIN_VERSION_CC}
  VERBATIM)
add_library(shardtrain_version STATIC ${SHARDTRAIN_VERSION_CC})
add_dependencies(shardtrain_version shardtrain_version_gen)
