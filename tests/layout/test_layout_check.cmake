# tests/layout/test_layout_check.cmake — the layout check (cmake/check_layout.cmake)
# passes on the source tree and fails on copies of it with one forbidden include
# each: model -> serve by name, serve -> cli by relative path, tiers -> model;
# then with the scheduler calling the block table, and with the sessions
# including the scheduler's internals.
# Run by CTest as: cmake -DSRC=<source> -DWORK=<scratch dir> -P this file.
set(check ${SRC}/cmake/check_layout.cmake)
execute_process(COMMAND ${CMAKE_COMMAND} -DKVT_LAYOUT_ROOT=${SRC} -P ${check}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the source tree fails the layout check:\n${err}")
endif()

set(cases
  "engine/model/gguf.c|server.h|engine/serve/"
  "engine/serve/stack.h|../cli/cli_index.h|engine/cli/"
  "tiers/t0_pool.c|model.h|engine/model/")
foreach(c ${cases})
  string(REPLACE "|" ";" c "${c}")
  list(GET c 0 file)
  list(GET c 1 inc)
  list(GET c 2 want)
  file(REMOVE_RECURSE ${WORK})
  foreach(m core gpu index tiers engine)
    file(COPY ${SRC}/${m} DESTINATION ${WORK})
  endforeach()
  file(APPEND ${WORK}/${file} "\n#include \"${inc}\"\n")
  execute_process(COMMAND ${CMAKE_COMMAND} -DKVT_LAYOUT_ROOT=${WORK} -P ${check}
    RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${file} including \"${inc}\" passed the layout check")
  endif()
  string(REGEX REPLACE "[ \t\n]+" " " flat "${err}") # CMake wraps messages
  string(FIND "${flat}" "${file} includes \"${inc}\" from ${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${file} including \"${inc}\": the error does not name it:\n${err}")
  endif()
  message(STATUS "ok: ${file} including \"${inc}\" fails the check")
endforeach()
# the seam: the scheduler calling the block table directly fails the check, naming the call
file(REMOVE_RECURSE ${WORK})
foreach(m core gpu index tiers engine)
  file(COPY ${SRC}/${m} DESTINATION ${WORK})
endforeach()
file(APPEND ${WORK}/engine/serve/scheduler.c "\nstatic void bad(kvt_btable *bt) { kvt_btable_touch(bt, NULL); }\n")
execute_process(COMMAND ${CMAKE_COMMAND} -DKVT_LAYOUT_ROOT=${WORK} -P ${check}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
string(REGEX REPLACE "[ \t\n]+" " " flat "${err}")
string(FIND "${flat}" "engine/serve/scheduler.c calls kvt_btable_touch(" at)
if(rc EQUAL 0 OR at EQUAL -1)
  message(FATAL_ERROR "the scheduler calling kvt_btable_touch passed the layout check, or the error does not name it:\n${err}")
endif()
message(STATUS "ok: engine/serve/scheduler.c calling kvt_btable_touch fails the check")
# the scheduler's internals: the sessions including sched_int.h (the circle issue 48 broke) fail the check
file(REMOVE_RECURSE ${WORK})
foreach(m core gpu index tiers engine)
  file(COPY ${SRC}/${m} DESTINATION ${WORK})
endforeach()
file(APPEND ${WORK}/engine/serve/sessions.c "\n#include \"sched_int.h\"\n")
execute_process(COMMAND ${CMAKE_COMMAND} -DKVT_LAYOUT_ROOT=${WORK} -P ${check}
  RESULT_VARIABLE rc ERROR_VARIABLE err)
string(REGEX REPLACE "[ \t\n]+" " " flat "${err}")
string(FIND "${flat}" "engine/serve/sessions.c includes \"sched_int.h\"" at)
if(rc EQUAL 0 OR at EQUAL -1)
  message(FATAL_ERROR "engine/serve/sessions.c including sched_int.h passed the layout check, or the error does not name it:\n${err}")
endif()
message(STATUS "ok: engine/serve/sessions.c including sched_int.h fails the check")
file(REMOVE_RECURSE ${WORK})
