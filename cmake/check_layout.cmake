# cmake/check_layout.cmake — fails the build when an include runs against the
# dependency graph (STYLE §1, DESIGN §7):
#
#   engine/cli -> engine/serve -> engine/model -> tiers -> {index, gpu} -> core
#
# The module libraries' include paths already keep a header of a higher room
# out of reach; this check also catches what include paths cannot: a relative
# include ("../serve/server.h") and a header moved to the wrong folder. Every
# quoted include of a C/CUDA file in a module is resolved to a file of the tree
# (relative to the including file first, then by name in every module); one
# that resolves only to a module the includer may not use is an error naming
# both files. Quoted includes that name no file of the tree (toolkit headers)
# are not ours and are skipped.
#
# Run with: cmake -DKVT_LAYOUT_ROOT=<tree> -P cmake/check_layout.cmake
# (the build runs it on the source tree before compiling anything; the test
# test_layout_check runs it on a tree with a forbidden include, which must fail).
#
# Two rules inside engine/serve: the scheduler's internals (sched_int.h) are
# included by the scheduler's files alone (scheduler.c, sched_*.c), and those
# files reach the tiers only through the manager's prefix-cache handle (the
# seam, below).
if(NOT KVT_LAYOUT_ROOT)
  message(FATAL_ERROR "check_layout: set -DKVT_LAYOUT_ROOT=<source tree>")
endif()

# module -> the modules it may include (itself always)
set(mods core gpu index tiers engine/model engine/serve engine/cli)
set(allow_core "")
set(allow_gpu core)
set(allow_index core)
set(allow_tiers index gpu core)
set(allow_engine/model tiers index gpu core)
set(allow_engine/serve engine/model tiers index gpu core)
set(allow_engine/cli engine/serve engine/model tiers index gpu core)

# A module's files may sit one folder down (gpu/cuda/): they belong to the module.
# name -> module, for every header of a module
foreach(m ${mods})
  file(GLOB hdrs ${KVT_LAYOUT_ROOT}/${m}/*.h ${KVT_LAYOUT_ROOT}/${m}/*.cuh ${KVT_LAYOUT_ROOT}/${m}/*/*.h
       ${KVT_LAYOUT_ROOT}/${m}/*/*.cuh)
  foreach(hp ${hdrs})
    get_filename_component(h ${hp} NAME)
    if(DEFINED owner_${h})
      message(FATAL_ERROR "check_layout: header ${h} is in both ${owner_${h}}/ and ${m}/ (one name, one module)")
    endif()
    set(owner_${h} ${m})
  endforeach()
endforeach()

set(n_bad 0)
foreach(m ${mods})
  file(GLOB srcs ${KVT_LAYOUT_ROOT}/${m}/*.c ${KVT_LAYOUT_ROOT}/${m}/*.h
       ${KVT_LAYOUT_ROOT}/${m}/*.cu ${KVT_LAYOUT_ROOT}/${m}/*.cuh
       ${KVT_LAYOUT_ROOT}/${m}/*/*.c ${KVT_LAYOUT_ROOT}/${m}/*/*.h
       ${KVT_LAYOUT_ROOT}/${m}/*/*.cu ${KVT_LAYOUT_ROOT}/${m}/*/*.cuh)
  foreach(src ${srcs})
    file(STRINGS ${src} incs REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
    get_filename_component(dir ${src} DIRECTORY)
    foreach(line ${incs})
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" inc "${line}")
      # The scheduler's internals are private to its files: the sessions and the server reach it
      # through scheduler.h and sessions.h, so nothing depends back on its state.
      get_filename_component(inc_name ${inc} NAME)
      if(inc_name STREQUAL "sched_int.h")
        file(RELATIVE_PATH rel ${KVT_LAYOUT_ROOT} ${src})
        if(NOT rel MATCHES "^engine/serve/(scheduler|sched_[a-z_]+)\\.[ch]$")
          message(SEND_ERROR "layout: ${rel} includes \"sched_int.h\", the scheduler's internals: only "
            "engine/serve/scheduler.c and sched_*.c may (the sessions have sessions.h)")
          math(EXPR n_bad "${n_bad} + 1")
        endif()
      endif()
      set(target_mod "")
      if(EXISTS ${dir}/${inc})
        get_filename_component(abs ${dir}/${inc} REALPATH)
        get_filename_component(absdir ${abs} DIRECTORY)
        file(RELATIVE_PATH target_mod ${KVT_LAYOUT_ROOT} ${absdir})
        foreach(mm ${mods}) # a module's subfolder is the module
          string(FIND "${target_mod}/" "${mm}/" at)
          if(at EQUAL 0)
            set(target_mod ${mm})
          endif()
        endforeach()
      else()
        get_filename_component(name ${inc} NAME)
        if(DEFINED owner_${name})
          set(target_mod ${owner_${name}})
        endif()
      endif()
      if(target_mod STREQUAL "" OR target_mod STREQUAL m)
        continue()
      endif()
      list(FIND allow_${m} ${target_mod} ok)
      if(ok EQUAL -1)
        file(RELATIVE_PATH rel ${KVT_LAYOUT_ROOT} ${src})
        message(SEND_ERROR "layout: ${rel} includes \"${inc}\" from ${target_mod}/, "
          "but ${m}/ may use only: ${allow_${m}} (cli -> serve -> model -> tiers -> {index, gpu} -> core)")
        math(EXPR n_bad "${n_bad} + 1")
      endif()
    endforeach()
  endforeach()
endforeach()
# The seam between the scheduler and the tiers (DESIGN §3, "the prefix-cache handle"): the
# scheduler (scheduler.c and its sched_*.c files) reaches the cache through the manager's prefix
# handle, its registration and its end of turn; it never calls the block table or the index,
# never takes or drops a T0 slot, and never drives the manager's lower-level promotion calls
# itself. (The sessions, sessions.c, keep their rows in the index: they are not the scheduler.)
file(GLOB seam_srcs ${KVT_LAYOUT_ROOT}/engine/serve/scheduler.c ${KVT_LAYOUT_ROOT}/engine/serve/sched_*.c)
set(seam_re "kvt_btable_[a-z_]+[ \t]*\\(|kvt_db_[a-z_]+[ \t]*\\(|kvt_t0_(alloc|ref|unref|slot_[a-z]+)[ \t]*\\(|kvt_tm_(lookup|submit|promote|ticket|pin|unpin|layered|prefetch)[a-z_]*[ \t]*\\(")
foreach(src ${seam_srcs})
  file(RELATIVE_PATH seam_src ${KVT_LAYOUT_ROOT} ${src})
  file(STRINGS ${src} calls REGEX "${seam_re}")
  foreach(line ${calls})
    string(REGEX MATCH "${seam_re}" call "${line}")
    message(SEND_ERROR "layout: ${seam_src} calls ${call}...: the scheduler reaches the tiers only through the "
      "manager's prefix-cache handle (tiers/manager.h)")
    math(EXPR n_bad "${n_bad} + 1")
  endforeach()
endforeach()
if(n_bad GREATER 0)
  message(FATAL_ERROR "check_layout: ${n_bad} include(s) or call(s) against the dependency graph")
endif()
