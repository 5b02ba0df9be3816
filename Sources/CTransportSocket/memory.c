#include <malloc.h>
#include "CTransportSocket.h"

/* glibc keeps freed blocks inside its heap with their pages resident; malloc_trim gives every whole free
   page back to the kernel (docs/data-plane.md, "Idle memory"). */
void transport_release_free_memory(void) {
    (void)malloc_trim(0);
}
