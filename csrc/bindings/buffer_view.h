// BufferView: a contiguous Python buffer held for the duration of a binding call; a
// non-contiguous (or, when writable is asked, read-only) object raises BufferError.
// Release it with the GIL held: declare it before any gil_scoped_release in a scope.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>

namespace rlboost {

class BufferView {
 public:
  BufferView(const pybind11::object& obj, bool writable) {
    int flags = writable ? (PyBUF_SIMPLE | PyBUF_WRITABLE) : PyBUF_SIMPLE;
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) throw pybind11::error_already_set();
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

}  // namespace rlboost
