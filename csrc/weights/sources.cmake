list(APPEND RLBOOST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/chunk_tag.cpp
  ${CMAKE_CURRENT_LIST_DIR}/delta_codec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/delta_publish.cpp
  ${CMAKE_CURRENT_LIST_DIR}/manifest.cpp
  ${CMAKE_CURRENT_LIST_DIR}/region.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rate_limiter.cpp
  ${CMAKE_CURRENT_LIST_DIR}/version_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/server_conn.cpp
  ${CMAKE_CURRENT_LIST_DIR}/server.cpp
  ${CMAKE_CURRENT_LIST_DIR}/session.cpp
  ${CMAKE_CURRENT_LIST_DIR}/chunk_map.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pull_job.cpp
  ${CMAKE_CURRENT_LIST_DIR}/puller.cpp)
