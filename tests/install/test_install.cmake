# tests/install/test_install.cmake — `cmake --install` of this build into a
# scratch tree (DESTDIR=WORK/root, --prefix WORK/prefix, so that not even an
# absolute path such as /etc or /lib/systemd/system reaches the real system):
#  - the binaries, the three man pages (gzip'd), the docs, the config and the
#    systemd unit are installed;
#  - the installed config is the shipped configs/kvtier.conf;
#  - the unit runs BINDIR/kvtierd -c CONF, the configured paths;
#  - a changed config survives a second install, which puts the shipped one
#    beside it as kvtier.conf.new; an unchanged one is left alone.
#
# cmake -DBUILD=DIR -DSRC=DIR -DWORK=DIR -DBINDIR=... -DCONF=... -P test_install.cmake
function(fail msg)
  message(FATAL_ERROR "test_install: FAIL: ${msg}")
endfunction()
function(install_once)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env DESTDIR=${WORK}/root
      ${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    fail("cmake --install: ${rc}\n${out}")
  endif()
  set(install_out "${out}" PARENT_SCOPE)
endfunction()
# the one file under WORK whose path ends in `tail`
function(find_one var tail)
  file(GLOB_RECURSE all LIST_DIRECTORIES false ${WORK}/*)
  set(hits "")
  foreach(f ${all})
    string(LENGTH "${f}" n)
    string(LENGTH "${tail}" t)
    if(n GREATER_EQUAL t)
      math(EXPR at "${n} - ${t}")
      string(SUBSTRING "${f}" ${at} -1 end)
      if(end STREQUAL tail)
        list(APPEND hits ${f})
      endif()
    endif()
  endforeach()
  list(LENGTH hits nh)
  if(NOT nh EQUAL 1)
    fail("want one installed file ending in ${tail}, found ${nh}: ${hits}")
  endif()
  set(${var} ${hits} PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK})
install_once()
foreach(f /bin/kvtierd /bin/kvtier /man8/kvtierd.8.gz /man1/kvtier.1.gz /man5/kvtier.conf.5.gz
    /doc/kvtier/README.md /doc/kvtier/http-api.md /doc/kvtier/copyright /systemd/system/kvtier.service)
  find_one(path ${f})
endforeach()
find_one(conf /kvtier/kvtier.conf)
file(SHA256 ${conf} have)
file(SHA256 ${SRC}/configs/kvtier.conf want)
if(NOT have STREQUAL want)
  fail("${conf} is not configs/kvtier.conf")
endif()

find_one(unit /systemd/system/kvtier.service)
file(STRINGS ${unit} exec REGEX "^ExecStart=")
if(NOT exec STREQUAL "ExecStart=${BINDIR}/kvtierd -c ${CONF}")
  fail("the unit says '${exec}', want 'ExecStart=${BINDIR}/kvtierd -c ${CONF}'")
endif()
file(STRINGS ${unit} left REGEX "@[A-Z_]+@")
if(left)
  fail("unexpanded template variables in the unit: ${left}")
endif()

# an unchanged config: left alone; a changed one: kept, the shipped one beside it
install_once()
if(EXISTS ${conf}.new)
  fail("an unchanged config got a kvtier.conf.new")
endif()
file(APPEND ${conf} "# the operator's change\n")
file(SHA256 ${conf} changed)
install_once()
file(SHA256 ${conf} after)
if(NOT after STREQUAL changed)
  fail("a second install overwrote the changed ${conf}")
endif()
if(NOT EXISTS ${conf}.new)
  fail("no ${conf}.new beside the changed config\n${install_out}")
endif()
file(SHA256 ${conf}.new new)
if(NOT new STREQUAL want)
  fail("${conf}.new is not the shipped config")
endif()
if(NOT install_out MATCHES "Keeping the changed")
  fail("the install did not say it kept the changed config:\n${install_out}")
endif()
file(REMOVE_RECURSE ${WORK})
message(STATUS "test_install: ok")
