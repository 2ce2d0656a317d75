# The three ctest labels every test carries one of (`ctest -L unit`, `-L cli`, `-L mpi`), chosen by
# the test's GoogleTest name (gtest filter patterns: `*` any run of characters, `?` one):
#   unit  runs in the test process alone (kernels, model, optimizer, data, comm on threads, ...);
#   cli   starts another program: the `lattice` CLI, the fault runner, or a python peer;
#   mpi   starts `mpirun`.
# A test matching an mpi pattern is mpi; else one matching a cli pattern is cli; the rest are unit.
# A new test that starts a program needs a name these patterns catch (a suite ending in Cli, a name
# holding Mpirun) or a line here. TestLabels.EveryTestHasOneLabel checks that every registered
# test carries exactly one of the three.
set(LATTICE_MPI_TEST_PATTERNS
    "*Mpirun*"
    "*MpiProcess*"
    "*/MpiSuite.*"
    "MpiLarge.*"
    "MpiTcp.*"
    "MpiHierarchical.*"
    "MpiWatchdog.*"
    "TreeAllreduceMpi.*"
    "MeshMpi.EveryLayout*")
set(LATTICE_CLI_TEST_PATTERNS
    "*Cli.*"
    "PipelineMemory.EstimateCli*"
    "*PythonReader*"
    "*PytorchParity.Regenerate*"
    "ConfigDocs.*"
    "TokenizerTrainer.ReadByTiktokenAndHuggingFace"
    "Planner.SearchesPipelinesThatDoNotDivideTheLayers"
    "TensorBoardEvents.TensorBoardReads*")

# gtest_discover_tests for `target`, once per label with its filter; other arguments are passed on
# (TEST_PREFIX, ...), ENVIRONMENT is the tests' environment.
function(lattice_discover_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 discover "" "ENVIRONMENT" "")
  string(JOIN ":" mpi ${LATTICE_MPI_TEST_PATTERNS})
  string(JOIN ":" cli ${LATTICE_CLI_TEST_PATTERNS})
  foreach(label mpi cli unit)
    if(label STREQUAL "mpi")
      set(filter "${mpi}")
    elseif(label STREQUAL "cli")
      set(filter "${cli}-${mpi}")
    else()
      set(filter "-${cli}:${mpi}")
    endif()
    gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60 TEST_FILTER "${filter}"
                         ${discover_UNPARSED_ARGUMENTS}
                         PROPERTIES TIMEOUT 900 LABELS ${label}
                                    ENVIRONMENT "${discover_ENVIRONMENT}")
  endforeach()
endfunction()
