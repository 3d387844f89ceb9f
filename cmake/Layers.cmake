# Layers: one static library per top-level folder, each linking only the layers below it:
#   proxyep_common <- proxyep_fabric, proxyep_gpu_side <- proxyep_control <- proxyep_proxy
#   <- proxyep_integrations <- tools (the proxyep executable, proxyep_ep_bench)
# (control links common only; proxy links control, fabric and gpu_side; proxyep_metrics links
# common only, and integrations links it beside proxy. proxyep_daemon, the node daemon proxyepd,
# sits beside integrations on proxy and metrics; tools link it for proxyepd and `proxyep status`.)
#
# Includes stay rooted at the repository ("fabric/fabric.hpp"), but no target is given the
# repository root. Folder F gets an include root of its own, ${PROXYEP_INCLUDE_ROOTS}/F, holding
# one symlink F -> <repo>/F; it is library F's PUBLIC include directory, so a target sees the
# folders of the libraries it links (transitively) and no other. An include that points up a
# layer therefore fails to compile ("proxy/engine/proxy_engine.hpp: No such file or directory"), not
# just to link. (A quoted include is also looked up beside the including file, but from
# <repo>/control/x.cpp that is <repo>/control/proxy/..., which does not exist; a "../" include
# would escape, and tests/check_layers.sh rejects those.)
#
# Headers too: every header of a layer is in its library's HEADERS file set, based at the
# include root, and VERIFY_INTERFACE_HEADER_SETS compiles each one alone against the library's
# usage requirements (its own root and those below). So an upward include in a header that no
# .cpp of its layer includes fails as well. The checks build as part of `all` (target
# proxyep_check_headers; PROXYEP_CHECK_HEADERS=OFF leaves them out).
option(PROXYEP_CHECK_HEADERS "Compile every layer header on its own as part of the build" ON)
set(PROXYEP_INCLUDE_ROOTS ${PROJECT_BINARY_DIR}/include_roots)

# Warnings of every layer library (and of the code built on them).
set(PROXYEP_WARNINGS -Wall -Wextra -Wpedantic $<$<BOOL:${PROXYEP_WERROR}>:-Werror>)

if(PROXYEP_CHECK_HEADERS)
  add_custom_target(proxyep_check_headers ALL)
else()
  add_custom_target(proxyep_check_headers)
endif()

# proxyep_include_root(<folder> <out-var>): creates the include root of repository folder
# <folder> (a directory holding the symlink <folder> -> <repo>/<folder>) and returns its path.
function(proxyep_include_root folder out)
  set(root ${PROXYEP_INCLUDE_ROOTS}/${folder})
  set(link ${root}/${folder})
  file(MAKE_DIRECTORY ${root})
  if(IS_SYMLINK ${link})
    file(READ_SYMLINK ${link} target)
    if(NOT target STREQUAL "${PROJECT_SOURCE_DIR}/${folder}")
      file(REMOVE ${link})
    endif()
  endif()
  if(NOT IS_SYMLINK ${link})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${link} SYMBOLIC)
  endif()
  set(${out} ${root} PARENT_SCOPE)
endfunction()

# proxyep_layer_headers(<target> <folder> [SUBFOLDER <sub>] [EXCLUDE <sub>...]): every .hpp under
# <folder> (or <folder>/<sub>), globbed so that a new header is checked without anyone listing
# it, except those under the excluded subfolders, as <target>'s PUBLIC HEADERS file set based at
# the folder's include root, each compiled alone.
function(proxyep_layer_headers target folder)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "SUBFOLDER" "EXCLUDE")
  proxyep_include_root(${folder} root)
  set(where ${folder})
  if(arg_SUBFOLDER)
    set(where ${folder}/${arg_SUBFOLDER})
  endif()
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR}
       ${PROJECT_SOURCE_DIR}/${where}/*.hpp)
  foreach(subfolder IN LISTS arg_EXCLUDE)
    list(FILTER headers EXCLUDE REGEX "^${folder}/${subfolder}/")
  endforeach()
  # Named through the include root (the symlink), so they lie under the file set's base.
  list(TRANSFORM headers PREPEND ${root}/)
  target_sources(${target} PUBLIC FILE_SET HEADERS BASE_DIRS ${root} FILES ${headers})
  set_target_properties(${target} PROPERTIES VERIFY_INTERFACE_HEADER_SETS ON)
  add_dependencies(proxyep_check_headers ${target}_verify_interface_header_sets)
endfunction()

# proxyep_add_layer(<folder> [LINK <libraries>...] [EXCLUDE_HEADERS <subfolder>...]): the static
# library proxyep_<folder>, PUBLIC-linking <libraries>, its include root and header checks. The
# folder's CMakeLists.txt adds the sources with target_sources().
function(proxyep_add_layer folder)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "LINK;EXCLUDE_HEADERS")
  set(target proxyep_${folder})
  add_library(${target} STATIC)
  target_link_libraries(${target} PUBLIC ${arg_LINK})
  target_compile_options(${target} PRIVATE ${PROXYEP_WARNINGS})
  proxyep_layer_headers(${target} ${folder} EXCLUDE ${arg_EXCLUDE_HEADERS})
endfunction()
