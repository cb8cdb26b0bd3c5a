# RLBOOST_LTO: link-time optimisation of every host target in an optimised build, so the
# core, kept as a static library, is optimised across files as one module with the
# bindings that call it (as when every source was compiled into the module itself).
# Instrumented builds (sanitizers, fuzzing) go without: their reports should point at
# the code as written. Sets CMAKE_INTERPROCEDURAL_OPTIMIZATION, which also tells pybind11
# not to add LTO flags of its own.
set(_rlboost_lto OFF)
if(RLBOOST_LTO AND NOT RLBOOST_SANITIZE AND NOT RLBOOST_FUZZ
   AND CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo|MinSizeRel)$")
  include(CheckIPOSupported)
  check_ipo_supported(RESULT _rlboost_lto OUTPUT _rlboost_lto_why LANGUAGES CXX)
  if(NOT _rlboost_lto)
    message(STATUS "rlboost: building without LTO: the compiler does not support it (${_rlboost_lto_why})")
  endif()
endif()
set(CMAKE_INTERPROCEDURAL_OPTIMIZATION ${_rlboost_lto})
