list(APPEND RLBOOST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/module.cpp
  ${CMAKE_CURRENT_LIST_DIR}/errors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transfer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checksums.cpp
  ${CMAKE_CURRENT_LIST_DIR}/migration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/delta.cpp)
