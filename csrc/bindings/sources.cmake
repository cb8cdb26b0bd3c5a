list(APPEND RLBOOST_BINDING_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/module.cpp
  ${CMAKE_CURRENT_LIST_DIR}/errors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transfer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checksums.cpp
  ${CMAKE_CURRENT_LIST_DIR}/migration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/delta.cpp)
# Hooks that only tests call (rlboost._C_testing): never part of rlboost._C.
list(APPEND RLBOOST_TESTING_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/testing_module.cpp)
